"""End-to-end service benchmark: vlmq (gateway + Celery decode + inference worker) beside
``transformers serve`` (a peer), same checkpoint, same requests, same ``openai``-client load.

    python -m bench.service_bench [--quick | --smoke] [--levels 1,8,32] [--rounds 8] [--out DIR]

Closed loop at each concurrency: every client sends its next request when the previous one
ends, ``--rounds`` requests per client (at least 16 in all). Per level, three runs: the peer
through the openai client (streaming), vlmq through the openai client (streaming), vlmq over
``/v1/chat/ws`` (TTFT over WebSocket, per-stage timings from the done event). Pipeline
overhead: vlmq's end-to-end time at concurrency 1 (over ``/v1/chat/ws``) minus the engine-only
time (``Engine.generate_sync`` in process) for the same request, the two run back to back
(``paired_overhead``). Greedy, ``max_tokens`` 16, result
cache bypassed. ``--model PATH`` serves another checkpoint. Writes
bench/results/service_bench.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import httpx
import openai
from websockets.asyncio.client import ClientConnection, connect

from bench.profiling import Profiler
from bench.report_files import write_report
from bench.resources import Meter, Reading, cost, memory_by_kind
from bench.service_report import HOPS, markdown
from bench.service_workload import MAX_TOKENS, BenchRequest, Sample, make_requests, pct, summarize
from scripts.redis_launcher import free_port, start_redis
from shared.heap import freeze_startup_heap
from tests.support.models import test_model_path
from tests.support.stack import ALL, ServiceStack

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
NO_CACHE = {"Cache-Control": "no-cache"}
MODES = ("peer-openai", "vlmq-openai", "vlmq-ws")
REQUEST_TIMEOUT_S = 120  # a stuck request is recorded as an error, the run goes on
PAIRED_SEED = 555  # the overhead's pictures: none of the levels' (new to every cache)


# --- servers ---
class Peer:
    """``transformers serve`` in a subprocess that first imports ``services`` (processor class)."""

    def __init__(self, model: str, threads: int, log: Path, device: str = "cpu", dtype: str = "auto") -> None:
        self.model, self.port, self.log = model, free_port(), log
        code = (
            "import sys, services\nfrom transformers.cli.transformers import main\n"
            f"sys.argv = ['transformers', 'serve', {model!r}, '--host', '127.0.0.1', '--port', '{self.port}',"
            f" '--device', {device!r}, '--dtype', {dtype!r}, '--log-level', 'warning']\nmain()"
        )
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": str(threads),
            "TOKENIZERS_PARALLELISM": "false",
        }
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.base_url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout_s: float = 180) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"transformers serve exited:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.base_url}/v1/models", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError("transformers serve not ready")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()


# --- clients ---
async def openai_call(
    client: openai.AsyncOpenAI,
    model: str,
    req: BenchRequest,
    max_tokens: int = MAX_TOKENS,
    extra: dict[str, Any] | None = None,
) -> Sample:
    """One streamed chat completion; ``extra``: more arguments (e.g. ``stream_options`` for vlmq)."""
    start, ttft, parts, completion = time.perf_counter(), None, [], None
    messages: Any = req.openai_messages()
    try:
        stream: Any = await client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            extra_headers=NO_CACHE,
            **(extra or {}),
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                ttft = ttft if ttft is not None else time.perf_counter() - start
                parts.append(chunk.choices[0].delta.content)
            if getattr(chunk, "usage", None) is not None:
                completion = chunk.usage.completion_tokens
    except openai.APIError as exc:
        return Sample(req.index, time.perf_counter() - start, ttft, "".join(parts), error=str(exc))
    return Sample(req.index, time.perf_counter() - start, ttft, "".join(parts), completion_tokens=completion)


async def ws_call(ws: ClientConnection, req: BenchRequest) -> Sample:
    """One job over an open ``/v1/chat/ws`` connection: submit, stream to the done event."""
    start, ttft, parts = time.perf_counter(), None, list[str]()
    message = json.dumps(
        {"prompt": req.question, "image": req.data_url, "max_tokens": MAX_TOKENS, "no_cache": True}
    )
    sent_at, job_id = time.time(), cast(str | None, None)
    await ws.send(message)

    def sample(timings: dict[str, float] | None = None, error: str | None = None) -> Sample:
        e2e, text = time.perf_counter() - start, "".join(parts)
        return Sample(req.index, e2e, ttft, text, timings, error, job_id=job_id, sent_at=sent_at)

    while True:
        try:
            event = json.loads(await asyncio.wait_for(ws.recv(), REQUEST_TIMEOUT_S))
        except TimeoutError:
            return sample(error="timeout")
        if event["type"] == "accepted":
            job_id = event["id"]
        elif event["type"] == "token" and event.get("text"):
            ttft = ttft if ttft is not None else time.perf_counter() - start
            parts.append(event["text"])
        elif event["type"] == "done":
            return sample(event.get("timings"))
        elif event["type"] == "error" or event.get("status") in ("failed", "cancelled", "expired"):
            return sample(error=str(event))


async def closed_loop(
    requests: list[BenchRequest],
    concurrency: int,
    make_client: Callable[[], Awaitable[Callable[[BenchRequest], Awaitable[Sample]]]],
) -> tuple[list[Sample], float]:
    queue = list(reversed(requests))
    samples: list[Sample] = []

    async def client() -> None:
        call = await make_client()
        while queue:
            samples.append(await call(queue.pop()))

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return sorted(samples, key=lambda s: s.index), time.perf_counter() - start


async def run_mode(
    mode: str,
    stack: ServiceStack,
    peer: Peer,
    model_name: str,
    peer_model: str,
    requests: list[BenchRequest],
    concurrency: int,
) -> tuple[list[Sample], float]:
    if mode == "vlmq-ws":
        sockets: list[ClientConnection] = []

        async def ws_client() -> Callable[[BenchRequest], Awaitable[Sample]]:
            ws = await connect(f"{stack.ws_url}/v1/chat/ws", max_size=None)
            sockets.append(ws)
            return lambda req: ws_call(ws, req)

        try:
            return await closed_loop(requests, concurrency, ws_client)
        finally:
            for ws in sockets:
                await ws.close()
    base, name = (peer.base_url, peer_model) if mode == "peer-openai" else (stack.base_url, model_name)
    client = openai.AsyncOpenAI(
        base_url=f"{base}/v1", api_key="bench", timeout=REQUEST_TIMEOUT_S, max_retries=0
    )

    async def oai_client() -> Callable[[BenchRequest], Awaitable[Sample]]:
        return lambda req: openai_call(client, name, req)

    try:
        return await closed_loop(requests, concurrency, oai_client)
    finally:
        await client.close()


# --- engine only ---
class EngineOnly:
    """``Engine.generate_sync`` in this process, one request at a time (pixels made as the decode
    and inference workers make them, outside the timing), with the servers' torch thread count."""

    def __init__(self, model: str, threads: int) -> None:
        import torch

        import services  # noqa: F401  (registers the processor)
        from services.engine import Engine, EngineConfig
        from services.vlm.image_processor import ImageProcessorHandle

        torch.set_num_threads(threads)
        self.engine = Engine.from_pretrained(EngineConfig(model_path=model, device="cpu"))
        self.engine.prewarm()
        self.engine.start()
        self.handle = ImageProcessorHandle.load(model)
        self.runs = 0

    def run(self, req: BenchRequest) -> tuple[float, str]:
        """Seconds and text of one request."""
        from services.inference_worker.engine_request import build_request
        from shared.schemas import ChatTurn, JobSpec, SamplingSpec
        from tests.support.reference import decoded_image

        spec = JobSpec(
            job_id=f"e{req.index}",
            created_at=time.time(),
            messages=[ChatTurn(role="user", text=req.question, image=True)],
            sampling=SamplingSpec(max_tokens=MAX_TOKENS),
        )
        self.runs += 1
        request = build_request(spec, f"engine-{self.runs}", decoded_image(self.handle, req.image))
        start = time.perf_counter()
        events = self.engine.generate_sync(request, timeout_s=120)
        return time.perf_counter() - start, "".join(e.text for e in events)

    def close(self) -> None:
        self.engine.stop()


async def paired_overhead(
    stack: ServiceStack, model: str, threads: int, warm: BenchRequest, requests: list[BenchRequest]
) -> tuple[list[Sample], list[tuple[float, str]]]:
    """Each request through the engine alone and through the stack (``/v1/chat/ws``) back to back,
    the order alternating, the stack otherwise idle: the host's drift hits both halves of every pair
    (measured minutes apart, the two medians differed by more than the overhead itself)."""
    engine = await asyncio.to_thread(EngineOnly, model, threads)
    ws = await connect(f"{stack.ws_url}/v1/chat/ws", max_size=None)
    samples: list[Sample] = []
    alone: list[tuple[float, str]] = []
    try:
        await asyncio.to_thread(engine.run, warm)  # dropped; a picture no pair shows (image cache)
        freeze_startup_heap("bench")  # the engine alone runs as the inference worker does: frozen
        for i, req in enumerate(requests):
            if i % 2 == 0:
                alone.append(await asyncio.to_thread(engine.run, req))
                samples.append(await ws_call(ws, req))
            else:
                samples.append(await ws_call(ws, req))
                alone.append(await asyncio.to_thread(engine.run, req))
    finally:
        await ws.close()
        await asyncio.to_thread(engine.close)
    return samples, alone


# --- report ---
def load_average() -> str:
    """The machine's load averages (1, 5, 15 min): how busy the shared machine was."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def checkpoint_sha256(model: str) -> str:
    weights = Path(model) / "model.safetensors"
    return hashlib.sha256(weights.read_bytes()).hexdigest() if weights.exists() else "?"


def overhead(samples: list[Sample], engine: list[tuple[float, str]]) -> dict[str, float | None]:
    diffs = [s.e2e - engine[i][0] for i, s in enumerate(samples) if s.error is None]
    return {
        "engine_p50": statistics.median(t for t, _ in engine),
        "e2e_p50": pct([s.e2e for s in samples], 50),
        "overhead_p50": pct(diffs, 50),
        "overhead_p90": pct(diffs, 90),
    }


def hop_breakdown(samples: list[Sample], created: dict[str, float]) -> dict[str, dict[str, float | None]]:
    """Per-hop seconds (p50/p90) of WebSocket jobs: client clock + job hash + done-event timings."""
    rows: list[dict[str, float]] = []
    for s in samples:
        if s.error or not s.timings or s.sent_at is None or s.job_id not in created:
            continue
        t = s.timings
        engine = t["vision"] + t["prefill"] + t["generation"]
        gateway_in = created[s.job_id] - s.sent_at
        rows.append(
            {
                "gateway_in": gateway_in,
                "queue": t["queue"],
                "decode": t["decode"],
                "wait": t["wait"],
                "engine": engine,
                "worker_other": t["total"] - t["queue"] - t["decode"] - t["wait"] - engine,
                "stream_out": s.e2e - gateway_in - t["total"],
            }
        )
    return {k: {"p50": pct([r[k] for r in rows], 50), "p90": pct([r[k] for r in rows], 90)} for k in HOPS}


def created_times(stack: ServiceStack, samples: list[Sample]) -> dict[str, float]:
    out = {}
    for s in samples:
        if s.job_id and (raw := stack.redis.hget(stack.keys.job(s.job_id), "created_at")) is not None:
            out[s.job_id] = float(raw)
    return out


def agreement(a: list[Sample], b: list[Sample]) -> dict[str, Any]:
    pairs = list(zip(a, b, strict=True))
    same = sum(x.text.strip() == y.text.strip() for x, y in pairs)
    mismatches = [
        {"index": x.index, "a": x.text, "b": y.text} for x, y in pairs if x.text.strip() != y.text.strip()
    ]
    return {"compared": len(pairs), "identical": same, "mismatches": mismatches[:5]}


def meter_for(stack: ServiceStack, peer: Peer) -> Meter:
    groups = {name: proc.pid for name, proc in stack.procs.items()}
    return Meter(stack.redis, stack.keys, {**groups, "peer": peer.proc.pid})


async def measured_run(
    meter: Meter,
    mode: str,
    stack: ServiceStack,
    peer: Peer,
    model: str,
    requests: list[BenchRequest],
    c: int,
    profile: Path | None = None,
    repeat: int = 1,
) -> tuple[list[Sample], dict[str, Any]]:
    """One run with its cost: readings before and after (the engine's counters written after it);
    ``profile``: py-spy records every stack process into that folder meanwhile."""
    freeze_startup_heap("bench")  # this process is the load generator: no full-collection stalls
    before = await asyncio.to_thread(meter.read)
    with Profiler(profile, meter.groups) if profile else contextlib.nullcontext():
        samples, wall = await run_mode(mode, stack, peer, stack.settings.model_name, model, requests, c)
    after = await asyncio.to_thread(meter.read, time.time())
    summary = summarize(samples, wall, ramp=c)
    print(f"{mode:12s} c={c:<3d} {json.dumps({k: v for k, v in summary.items() if k != 'stages_p50'})}")
    return samples, {
        "mode": mode,
        "concurrency": c,
        "repeat": repeat,
        "summary": summary,
        "cost": cost(before, after, len(samples)),
    }


async def measure(args: argparse.Namespace, stack: ServiceStack, peer: Peer) -> dict[str, Any]:
    per_level = {c: max(args.requests, args.rounds * c) for c in args.levels}
    runs: list[dict[str, Any]] = []
    c1: dict[str, tuple[list[BenchRequest], list[Sample]]] = {}
    meter = meter_for(stack, peer)
    warm = make_requests(1 if args.mode == "smoke" else 2, seed=999)
    for mode in MODES:  # warm-up: model loads, first-request costs
        await run_mode(mode, stack, peer, stack.settings.model_name, args.model, warm, 1)
    for c in args.levels:
        for repeat in range(1, args.repeats + 1):  # interleaved: the host's drift hits every server
            # new pictures each repeat (vlmq's image cache must not have seen them); the peer and
            # vlmq-openai get the same ones
            seed = 100 + c + 1000 * (repeat - 1)
            shared_set, ws_set = make_requests(per_level[c], seed), make_requests(per_level[c], seed + 100)
            for mode in MODES:
                requests = ws_set if mode == "vlmq-ws" else shared_set
                top = (mode, c, repeat) == ("vlmq-openai", max(args.levels), 1)
                samples, run = await measured_run(
                    meter, mode, stack, peer, args.model, requests, c, args.profile if top else None, repeat
                )
                runs.append({**run, "seed": seed + 100 if mode == "vlmq-ws" else seed})
                if c == 1 and repeat == 1:
                    c1[mode] = (requests, samples)
    ws_samples = c1["vlmq-ws"][1] if "vlmq-ws" in c1 else []
    created = created_times(stack, ws_samples)
    warm_engine, *pairs = make_requests(per_level[1] + 1, PAIRED_SEED)
    paired = await paired_overhead(stack, args.model, args.threads, warm_engine, pairs)
    memory = await sustain(args, stack, meter) if args.sustain_s > 0 else None
    return {"runs": runs, "c1": c1, "created": created, "paired": paired, "memory": memory}


async def sustain(args: argparse.Namespace, stack: ServiceStack, meter: Meter) -> dict[str, Any]:
    """vlmq-openai at the highest level for ``sustain_s`` seconds: Redis memory per job at steady
    state (every job within the job TTL). Each request's JPEG is made unique (a numbered comment
    segment), so every job stores its own image bytes and pixels, as with real traffic."""
    pool, c = make_requests(args.sustain_pool, seed=777), max(args.levels)
    client = openai.AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key="bench", max_retries=0)
    kinds_before = await asyncio.to_thread(memory_by_kind, stack.redis, stack.key_prefix)
    before, peak, sent, done = meter.read(), 0, 0, 0
    end = time.monotonic() + args.sustain_s

    async def worker() -> None:
        nonlocal sent, done
        while time.monotonic() < end:
            sent += 1
            req = unique_request(pool[sent % len(pool)], sent)
            sample = await openai_call(client, stack.settings.model_name, req)
            done += sample.error is None
            if sample.error:
                print("sustain error:", sample.error[:300])

    async def watch() -> None:
        nonlocal peak
        while time.monotonic() < end:
            peak = max(peak, int(stack.redis.info("memory")["used_memory"]))
            await asyncio.sleep(1.0)

    started = time.monotonic()
    await asyncio.gather(watch(), *(worker() for _ in range(c)))
    await client.close()
    seconds = time.monotonic() - started
    after = await asyncio.to_thread(meter.read, time.time())
    kinds_after = await asyncio.to_thread(memory_by_kind, stack.redis, stack.key_prefix)
    return memory_summary(before, after, kinds_before, kinds_after, done, seconds, c, peak)


def unique_request(req: BenchRequest, n: int) -> BenchRequest:
    """The same picture with a JPEG comment (COM segment) naming ``n``: new bytes, new digest."""
    text = f"vlmq bench {n}".encode()
    comment = b"\xff\xfe" + (len(text) + 2).to_bytes(2, "big") + text
    return dataclasses.replace(req, image=req.image[:2] + comment + req.image[2:])


def memory_summary(
    before: Reading,
    after: Reading,
    kinds_before: dict[str, tuple[int, int]],
    kinds_after: dict[str, tuple[int, int]],
    jobs: int,
    seconds: float,
    c: int,
    peak: int,
) -> dict[str, Any]:
    """``used_memory`` growth per job over the sustained load, and each kind of key's share of it."""
    zero = (0, 0)
    grown = {
        kind: (n - kinds_before.get(kind, zero)[0], size - kinds_before.get(kind, zero)[1])
        for kind, (n, size) in kinds_after.items()
    }
    images = sum(size for kind, (_, size) in grown.items() if kind.startswith("img"))
    used = after.used_memory - before.used_memory
    return {
        "jobs": jobs,
        "seconds": seconds,
        "concurrency": c,
        "used_before": before.used_memory,
        "used_after": after.used_memory,
        "used_peak": max(peak, after.used_memory),
        "bytes_per_job": used / max(jobs, 1),
        "bytes_per_job_without_images": (used - images) / max(jobs, 1),
        "by_kind": grown,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer requests")
    parser.add_argument("--smoke", action="store_true", help="seconds: every code path once (make test)")
    parser.add_argument("--levels", default=None, help="concurrency levels (default 1,8,32; smoke 1,2)")
    parser.add_argument("--model", default=str(test_model_path()), help="checkpoint served by both")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON and markdown")
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="VLMQ_NAME=VALUE",
        help="a setting for every vlmq process (repeatable): A/B runs of one knob",
    )
    parser.add_argument(
        "--profile", type=Path, default=None, help="py-spy every process of the top vlmq-openai run into DIR"
    )
    parser.add_argument(
        "--sustain-s", type=float, default=None, help="sustained load for Redis memory (default 300; 0: none)"
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="requests per client per level (default 8; quick, smoke 2)"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs of every server per level, interleaved; the ratios' median and range are reported",
    )
    args = parser.parse_args(argv)
    args.mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    args.levels = [int(x) for x in (args.levels or ("1,2" if args.smoke else "1,8,32")).split(",")]
    if 1 not in args.levels:  # the overhead, the hops and the answers' agreement are measured there
        parser.error("--levels must include 1")
    args.requests = {"smoke": 2, "quick": 6, "full": 16}[args.mode]
    if args.rounds is None:  # at 2, much of the 32-client row was its ramp (all clients arriving at once)
        args.rounds = {"smoke": 2, "quick": 2, "full": 8}[args.mode]
    if args.sustain_s is None:
        args.sustain_s = {"smoke": 2.0, "quick": 30.0, "full": 300.0}[args.mode]
    args.sustain_pool = 8 if args.mode == "smoke" else 128
    return args


def stack_env(args: argparse.Namespace) -> dict[str, str]:
    return {
        "VLMQ_MODEL": args.model,
        "VLMQ_DECODE_CONCURRENCY": "2",
        "OMP_NUM_THREADS": str(args.threads),
        "VLMQ_LOG_LEVEL": "WARNING",
        # production timings, not the test stack's short fault-test ones; a smoke run's readings
        # wait for fresh heartbeats (engine counters) around each of its many tiny runs
        "VLMQ_HEARTBEAT_S": "0.25" if getattr(args, "mode", "full") == "smoke" else "2",
        "VLMQ_CLAIM_IDLE_MS": "30000",
        "VLMQ_VISIBILITY_TIMEOUT_S": "300",
        "VLMQ_WORKER_STALE_S": "10",
        **dict(item.split("=", 1) for item in getattr(args, "env", [])),
    }


def run_servers(args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    """Start Redis, the stack and the peer; measure every level; stop everything."""
    redis_server = start_redis()
    stack = ServiceStack(redis_server.url, logs, extra_env=stack_env(args), components=ALL)
    peer = Peer(args.model, args.threads, logs / "transformers-serve.log")
    try:
        stack.start()
        peer.wait_ready()
        return asyncio.run(measure(args, stack, peer))
    finally:
        peer.stop()
        stack.stop()
        redis_server.stop()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logs = Path(tempfile.mkdtemp(prefix="vlmq-bench-"))
    load_before = load_average()
    measured = run_servers(args, logs)
    load_after = load_average()
    ws_samples = measured["c1"]["vlmq-ws"][1]
    paired_ws, engine = measured["paired"]
    peer_c1, vlmq_c1 = measured["c1"]["peer-openai"][1], measured["c1"]["vlmq-openai"][1]
    result = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {args.threads} thread(s) per server",
        "mode": args.mode,
        "stack_env": args.env,
        "model": args.model,
        "model_sha256": checkpoint_sha256(args.model),
        "load_before": load_before,
        "load_after": load_after,
        "memory": measured["memory"],
        "max_tokens": MAX_TOKENS,
        "levels": args.levels,
        "repeats": args.repeats,
        "runs": measured["runs"],
        "stage_names": ["queue", "decode", "wait", "vision", "prefill", "generation", "ttft", "total"],
        "overhead": overhead(paired_ws, engine),
        "hops_c1": hop_breakdown(ws_samples, measured["created"]),
        "agreement": agreement(vlmq_c1, peer_c1),
        "engine_agreement": agreement(
            paired_ws, [Sample(i, t, None, text) for i, (t, text) in enumerate(engine)]
        ),
        "logs": str(logs),
    }
    write_report(args.out, "service_bench", args.mode, result, markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
