"""GPU benchmark: vlmq beside ``transformers serve`` on one CUDA device, a random GLM-4V of ~0.85B
parameters, the same requests through the same ``openai`` client.

    VLMQ_DEVICE=cuda python -m bench.gpu_bench [--levels 1,8,32] [--max-tokens 32] [--out DIR]
    python -m bench.gpu_bench --smoke          # CPU, a tiny config, seconds (a test runs it)

The checkpoint is written once to a temporary folder: the bundled model's tokenizer, chat template
and image processor (pictures squared to ``square_side``) with random weights of the chosen size.
Random weights stop at random, so the checkpoint declares an end token no logit row can produce
(an id past the vocabulary; the tokenizer has none): both servers generate exactly
``max_tokens`` (checked on every answer from its usage). Closed loop at each concurrency, as
``bench.service_bench``: TTFT p50/p99, throughput (requests/s, generated tokens/s) and CPU a request
by process (vlmq's forward and the CPU outside it: on a GPU the pipeline's share). Both servers
run the weights in bfloat16 on CUDA (vlmq ``VLMQ_QUANTIZE=bf16``, peer ``--dtype bfloat16``), in
float32 on CPU. Writes ``gpu_bench{,_smoke}.{json,md}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import openai

from bench.common import BUNDLED_MODEL, fit_mrope_sections
from bench.report_files import write_report
from bench.resources import STACK, cost
from bench.service_bench import REQUEST_TIMEOUT_S, RESULTS, Peer, closed_loop, meter_for, openai_call
from bench.service_workload import BenchRequest, Sample, make_requests, summarize
from scripts.redis_launcher import start_redis
from tests.support.stack import ALL, ServiceStack

TOKENIZER_FILES = ("tokenizer.json", "chat_template.jinja")


@dataclass(frozen=True)
class Size:
    text_hidden: int
    text_layers: int
    heads: int  # head dim = text_hidden / heads
    kv_heads: int
    vision_hidden: int
    vision_depth: int
    vision_heads: int
    square_side: int  # pixels; a multiple of 56 (patch 28 x merge 2): (side / 56)^2 image tokens


GPU = Size(1536, 24, 12, 2, 1024, 12, 16, 336)  # ~0.85B parameters, 36 image tokens
SMOKE = Size(64, 2, 2, 1, 64, 1, 2, 56)


def build_checkpoint(size: Size, out: Path, seed: int = 0) -> int:
    """Write a random GLM-4V of ``size`` with the bundled tokenizer and processor; its parameter count."""
    import torch
    from transformers import Glm4vConfig, Glm4vForConditionalGeneration

    cfg = Glm4vConfig.from_pretrained(BUNDLED_MODEL)
    tc: Any = cfg.text_config
    vc: Any = cfg.vision_config
    tc.hidden_size, tc.intermediate_size, tc.num_hidden_layers = (
        size.text_hidden,
        3 * size.text_hidden,
        size.text_layers,
    )
    tc.num_attention_heads, tc.num_key_value_heads = size.heads, size.kv_heads
    vc.hidden_size, vc.intermediate_size = size.vision_hidden, 4 * size.vision_hidden
    vc.depth, vc.num_heads, vc.out_hidden_size = size.vision_depth, size.vision_heads, size.text_hidden
    vc.image_size = size.square_side
    fit_mrope_sections(tc)
    torch.manual_seed(seed)
    model = Glm4vForConditionalGeneration(cfg).eval()
    model.generation_config.eos_token_id = [tc.vocab_size]  # unreachable: answers run to max_tokens
    model.generation_config.pad_token_id = tc.pad_token_id
    model.save_pretrained(out)
    _write_processing_files(out, size.square_side)
    return sum(p.numel() for p in model.parameters())


def _write_processing_files(out: Path, side: int) -> None:
    for name in TOKENIZER_FILES:
        shutil.copy(BUNDLED_MODEL / name, out / name)
    tokenizer = json.loads((BUNDLED_MODEL / "tokenizer_config.json").read_text())
    tokenizer["eos_token"] = None  # the template writes <|endoftext|> itself; generation has no end
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer, indent=2))
    processor = json.loads((BUNDLED_MODEL / "processor_config.json").read_text())
    image = processor["image_processor"]
    image["square_side"] = side
    image["size"] = {"longest_edge": 2 * side * side, "shortest_edge": 2 * side * side}
    (out / "processor_config.json").write_text(json.dumps(processor, indent=2))


# --- load ---
async def run_level(
    base_url: str, model: str, requests: list[BenchRequest], concurrency: int, max_tokens: int, vlmq: bool
) -> tuple[list[Sample], float]:
    """One closed-loop run; vlmq is asked for usage in its stream (the peer always sends it)."""
    client = openai.AsyncOpenAI(
        base_url=f"{base_url}/v1", api_key="bench", timeout=REQUEST_TIMEOUT_S, max_retries=0
    )
    extra = {"stream_options": {"include_usage": True}} if vlmq else None

    async def make() -> Any:
        return lambda req: openai_call(client, model, req, max_tokens, extra)

    try:
        return await closed_loop(requests, concurrency, make)
    finally:
        await client.close()


def level_row(
    server: str, concurrency: int, samples: list[Sample], wall: float, max_tokens: int
) -> dict[str, Any]:
    summary = summarize(samples, wall)
    short = [s.index for s in samples if s.error is None and s.completion_tokens != max_tokens]
    done = summary["requests"] - summary["errors"]
    return {
        "server": server,
        "concurrency": concurrency,
        **{
            k: summary[k] for k in ("requests", "errors", "qps", "ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99")
        },
        "tokens_per_s": (summary["qps"] or 0.0) * max_tokens if done else 0.0,
        "not_max_tokens": short,  # answers whose usage did not say max_tokens (must stay empty)
        "slowest_ttft": slowest_ttft(samples),
    }


def slowest_ttft(samples: list[Sample], n: int = 3) -> list[dict[str, float]]:
    """The slowest first tokens, in order of sending: which request of the run a p99 stands for."""
    timed = [s for s in samples if s.ttft is not None]
    slowest = sorted(timed, key=lambda s: s.ttft or 0.0, reverse=True)[:n]
    return [{"index": s.index, "ttft": s.ttft or 0.0, "sent_at": s.sent_at or 0.0} for s in slowest]


async def measure(args: argparse.Namespace, stack: ServiceStack, peer: Peer) -> list[dict[str, Any]]:
    servers = {"transformers-serve": (peer.base_url, str(args.checkpoint)), "vlmq": (stack.base_url, "vlmq")}
    warm = make_requests(2, seed=999)
    for name, (url, model) in servers.items():
        await run_level(url, model, warm, 1, args.max_tokens, name == "vlmq")
    meter = meter_for(stack, peer)
    rows = []
    for c in args.levels:
        requests = make_requests(max(args.requests, 2 * c), seed=300 + c)
        for name, (url, model) in servers.items():
            before = await asyncio.to_thread(meter.read, time.time())
            samples, wall = await run_level(url, model, requests, c, args.max_tokens, name == "vlmq")
            after = await asyncio.to_thread(meter.read, time.time())
            rows.append(level_row(name, c, samples, wall, args.max_tokens))
            rows[-1]["cpu"] = cpu_row(cost(before, after, len(samples)))
            print(json.dumps(rows[-1]), flush=True)
    return rows


def cpu_row(measured: dict[str, Any]) -> dict[str, float]:
    """CPU-ms a request by process (the peer's own process as ``peer``), the inference worker's
    forward (its engine thread inside prefill and decode: on a GPU, launching kernels and waiting for
    them) and the stack's CPU outside that forward: what the pipeline costs beside the model."""
    cpu = {k: round(v, 3) for k, v in measured["cpu_ms"].items()}
    forward, outside = measured["forward_cpu_ms"], measured["outside_forward_cpu_ms"]
    return {**cpu, "forward": round(forward, 3), "outside_forward": round(outside, 3)}


# --- the run ---
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny config, 1-2 clients (seconds)")
    parser.add_argument("--levels", default=None, help="concurrency levels (default 1,8,32; smoke 1,2)")
    parser.add_argument(
        "--max-tokens", type=int, default=None, help="tokens per answer (default 32; smoke 4)"
    )
    parser.add_argument("--requests", type=int, default=None, help="requests per level, at least 2 x clients")
    parser.add_argument("--device", default=os.environ.get("VLMQ_DEVICE", "cuda"), help="cuda or cpu")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON and markdown")
    args = parser.parse_args(argv)
    if args.smoke:
        args.device = "cpu"
    args.levels = [int(x) for x in (args.levels or ("1,2" if args.smoke else "1,8,32")).split(",")]
    args.max_tokens = args.max_tokens or (4 if args.smoke else 32)
    args.requests = args.requests or (2 if args.smoke else 32)
    args.size = SMOKE if args.smoke else GPU
    args.bf16 = args.device.startswith("cuda")
    return args


def stack_env(args: argparse.Namespace) -> dict[str, str]:
    return {
        "VLMQ_MODEL": str(args.checkpoint),
        "VLMQ_MODEL_NAME": "vlmq",
        "VLMQ_DEVICE": args.device,
        "VLMQ_QUANTIZE": "bf16" if args.bf16 else "none",
        "VLMQ_DECODE_CONCURRENCY": "2",
        "VLMQ_WARMUP_REQUESTS": "4",  # as the compose gpu profile and the k8s gpu overlay
        "VLMQ_LOG_LEVEL": "WARNING",
        "VLMQ_HEARTBEAT_S": "2",
        "VLMQ_CLAIM_IDLE_MS": "30000",
        "VLMQ_VISIBILITY_TIMEOUT_S": "300",
        "VLMQ_WORKER_STALE_S": "10",
    }


def run(args: argparse.Namespace, logs: Path) -> list[dict[str, Any]]:
    redis_server = start_redis()
    stack = ServiceStack(redis_server.url, logs, extra_env=stack_env(args), components=ALL)
    dtype = "bfloat16" if args.bf16 else "float32"
    peer = Peer(str(args.checkpoint), 1, logs / "transformers-serve.log", device=args.device, dtype=dtype)
    try:
        stack.start(timeout_s=600)
        peer.wait_ready(timeout_s=600)
        return asyncio.run(measure(args, stack, peer))
    finally:
        peer.stop()
        stack.stop()
        redis_server.stop()


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# GPU benchmark ({result['when']}, {result['device_name']})",
        "",
        f"random GLM-4V, {result['params'] / 1e9:.2f}B parameters ({result['dtype']}), "
        f"max_tokens {result['max_tokens']} exactly (no reachable end token), greedy, closed loop",
        "",
        "| server | conc | req (err) | req/s | tok/s | TTFT p50 | TTFT p99 | e2e p50 | e2e p99 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        times = " | ".join(
            "-" if r[k] is None else f"{r[k] * 1000:.0f}"
            for k in ("ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99")
        )
        lines.append(
            f"| {r['server']} | {r['concurrency']} | {r['requests']} ({r['errors']}) | {r['qps'] or 0:.2f} | "
            f"{r['tokens_per_s']:.0f} | {times} |"
        )
    lines += ["", "Times in ms. Ratios vlmq / transformers serve:", ""]
    lines += [f"- c={c}: {text}" for c, text in ratios(result["rows"]).items()]
    lines += ["", *cpu_table(result["rows"])]
    return "\n".join(lines) + "\n"


def cpu_table(rows: list[dict[str, Any]]) -> list[str]:
    """CPU-ms a request by process for vlmq's runs (this host's CPU, whatever the device)."""
    lines = [
        "vlmq's CPU-milliseconds a request by process (`/proc`; Redis: INFO cpu); forward: the engine"
        " thread inside prefill and decode; outside: gateway + decode + inference + Redis - forward; for"
        " transformers serve, its own process:",
        "",
        "| server | conc | gateway | decode | inference | redis | forward | outside forward | peer |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    ours = (*STACK, "forward", "outside_forward")
    for r in rows:
        cpu, vlmq = r.get("cpu") or {}, r["server"] == "vlmq"
        shown = ours if vlmq else ("peer",)  # the other server's processes idle meanwhile
        columns = (*ours, "peer")
        cells = " | ".join(f"{cpu.get(k, 0.0):.1f}" if k in shown else "-" for k in columns)
        lines.append(f"| {r['server']} | {r['concurrency']} | {cells} |")
    return lines


def ratios(rows: list[dict[str, Any]]) -> dict[int, str]:
    out = {}
    for c in sorted({r["concurrency"] for r in rows}):
        peer = next(r for r in rows if r["concurrency"] == c and r["server"] == "transformers-serve")
        ours = next(r for r in rows if r["concurrency"] == c and r["server"] == "vlmq")
        if peer["qps"] and ours["qps"] and peer["ttft_p50"] and ours["ttft_p50"]:
            throughput, p50 = ours["qps"] / peer["qps"], ours["ttft_p50"] / peer["ttft_p50"]
            p99 = ours["ttft_p99"] / peer["ttft_p99"]
            out[c] = f"throughput {throughput:.2f}x, TTFT p50 {p50:.2f}x, TTFT p99 {p99:.2f}x"
    return out


def device_name(device: str) -> str:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"{platform.machine()} CPU, {os.cpu_count()} cores"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logs = Path(tempfile.mkdtemp(prefix="vlmq-gpu-bench-"))
    args.checkpoint = logs / "checkpoint"
    params = build_checkpoint(args.size, args.checkpoint)
    print(f"checkpoint: {params / 1e6:.0f}M parameters in {args.checkpoint}", flush=True)
    rows = run(args, logs)
    result = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "device": args.device,
        "device_name": device_name(args.device),
        "params": params,
        "size": asdict(args.size),
        "dtype": "bfloat16" if args.bf16 else "float32",
        "max_tokens": args.max_tokens,
        "rows": rows,
        "logs": str(logs),
    }
    write_report(args.out, "gpu_bench", "smoke" if args.smoke else "full", result, markdown(result))
    shutil.rmtree(args.checkpoint, ignore_errors=True)  # GBs at full size
    return 0 if all(not r["not_max_tokens"] and not r["errors"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
