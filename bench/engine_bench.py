"""Engine benchmark: ``make bench-engine`` (``python -m bench.engine_bench [--quick]``).

Everything runs side by side in one process, on the bundled model and on a ~89M-parameter random
Glm4v of the same architecture: throughput and latency under closed-loop load for (a) naive
sequential ``generate``, (b) the engine with batch cap 1, (c) the engine as configured; the TTFT
effect of each cache with the others as configured; decode efficiency against a bare batched
forward loop; each quantization mode's size, speed and agreement with fp32.
Results: a table on stdout, ``bench/results/engine_bench.json`` and ``engine_bench.png``.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench.common import build_large_glm, bundled_model_path, load_bundled
from bench.engine_report import print_table, save_chart
from bench.engine_workloads import (
    QUESTIONS,
    NaiveServer,
    bare_decode_tok_s,
    closed_loop,
    engine_submitter,
    make_conversations,
    make_items,
    timed_events,
    user,
)
from services.engine import Engine, EngineConfig, GenerationRequest, SamplingParams
from services.vlm.quantization import model_size_bytes, quantize_model

RESULTS = Path(__file__).resolve().parent / "results"
QUANT_MODES = ("none", "bf16", "int8", "int4")
IMAGE_SIZE = (128, 128)  # the cache sections' image size (vlmq-tiny squares any picture: 9 tokens)


def engine(model: Any, proc: Any, **cfg: Any) -> Engine:
    e = Engine(model, proc, EngineConfig(**cfg))
    e.prewarm()
    e.start()
    return e


def throughput(model: Any, proc: Any, plan: Plan) -> dict[str, Any]:
    """Closed-loop load on (a) naive generate, (b) engine with batch cap 1, (c) the engine as configured,
    for two workloads: single questions about new images, and two-turn conversations (the follow-up
    resends the history). Configurations are interleaved; each keeps its best of ``plan.reps`` runs
    (the CPU is shared with other work)."""
    workloads = {
        "single": [[it] for it in make_items(proc, plan.workload, seed=1)],
        "two_turn": make_conversations(proc, plan.workload // 2, seed=7),
    }
    sampling = SamplingParams(max_tokens=plan.max_new)
    naive = NaiveServer(model, plan.max_new)
    engines = {"b_engine_batch1": engine(model, proc, max_batch=1), "c_engine": engine(model, proc)}
    submit = {
        "a_naive_generate": naive.submit,
        **{k: engine_submitter(e, sampling) for k, e in engines.items()},
    }
    for fn in submit.values():
        closed_loop(fn, workloads["single"], 4, plan.warmup)
    out: dict[str, Any] = {}
    for wname, convs in workloads.items():
        res: dict[str, Any] = {name: [] for name in submit}
        for c in plan.clients:
            best: dict[str, Any] = {}
            for _ in range(plan.reps):
                for name, fn in submit.items():
                    r = closed_loop(fn, convs, c, plan.conversations(c) // len(convs[0]))
                    if name not in best or r.throughput > best[name].throughput:
                        best[name] = r
            for name, r in best.items():
                res[name].append(r.to_dict())
        out[wname] = res
    naive.close()
    for e in engines.values():
        e.stop()
    return out


def _ttft(e: Engine, req: GenerationRequest) -> float:
    ev = e.generate_sync(req)
    assert ev[-1].timings is not None
    return ev[-1].timings.ttft


def _on_off(
    model: Any,
    proc: Any,
    flag: str,
    reqs: list[tuple[GenerationRequest, GenerationRequest]],
    warm: list[GenerationRequest],
) -> dict[str, Any]:
    """Median TTFT of the same requests on an engine with ``flag`` on and one with it off (interleaved)."""
    on, off = engine(model, proc, **{flag: True}), engine(model, proc, **{flag: False})
    for e in (on, off):
        for w in warm:
            e.generate_sync(GenerationRequest(f"{w.request_id}-{id(e)}", w.messages, w.images, w.sampling))
    t_on, t_off = [], []
    for a, b in reqs:
        t_on.append(_ttft(on, a))
        t_off.append(_ttft(off, b))
    on.stop()
    off.stop()
    res = {"on": statistics.median(t_on), "off": statistics.median(t_off)}
    return {**res, "ratio": res["on"] / res["off"]}


def prefix_ttft(model: Any, proc: Any, n: int) -> dict[str, Any]:
    """Default system prompt, 1 client; images repeat from a warm pool (image cache as configured)."""
    pool = make_items(proc, 4, seed=2, size=IMAGE_SIZE)
    sampling = SamplingParams(max_tokens=1)
    reqs = []
    for i in range(n):
        it = pool[i % 4]
        msgs = [user(f"{QUESTIONS[i % len(QUESTIONS)]} ({i})")]
        reqs.append(tuple(GenerationRequest(f"p{k}{i}", msgs, it.images, sampling) for k in "ab"))
    return _on_off(model, proc, "prefix_cache", reqs, [it.request(sampling) for it in pool])  # type: ignore[arg-type]


def image_ttft(model: Any, proc: Any, n: int) -> dict[str, Any]:
    """The same image (fixed size) with different questions; prefix/session caches as configured."""
    it = make_items(proc, 1, seed=4, size=IMAGE_SIZE)[0]
    sampling = SamplingParams(max_tokens=1)
    reqs = [
        tuple(
            GenerationRequest(f"i{k}{i}", [user(f"Question number {i}?")], it.images, sampling) for k in "ab"
        )
        for i in range(n)
    ]
    res = _on_off(model, proc, "image_cache", reqs, [it.request(sampling)])  # type: ignore[arg-type]
    return {"image_tokens": int(it.images[0].image_grid_thw.prod()) // 4, **res}


def session_turn2(model: Any, proc: Any, n: int, max_new: int) -> dict[str, Any]:
    """Turn 2 of ``n`` two-turn conversations, session cache on vs off (other caches as configured)."""
    items = make_items(proc, n, seed=3, size=IMAGE_SIZE)
    engines = {"on": engine(model, proc, session_cache=True), "off": engine(model, proc, session_cache=False)}
    sampling = SamplingParams(max_tokens=max_new)
    ttft: dict[str, list[float]] = {"on": [], "off": []}
    lat: dict[str, list[float]] = {"on": [], "off": []}
    for i, it in enumerate(items):
        for key, e in engines.items():
            sid = f"sess-{key}-{i}"
            first = e.generate_sync(it.request(sampling, session_id=sid))
            answer = "".join(ev.text for ev in first)
            msgs = [
                *it.messages,
                {"role": "assistant", "content": [{"type": "text", "text": answer}]},
                user("And where is it?", image=False),
            ]
            t0 = time.perf_counter()
            second = e.generate_sync(
                GenerationRequest(f"t2-{sid}", msgs, it.images, sampling, session_id=sid)
            )
            lat[key].append(time.perf_counter() - t0)
            assert second[-1].timings is not None
            ttft[key].append(second[-1].timings.ttft)
    for e in engines.values():
        e.stop()
    res = {k: {"ttft": statistics.median(ttft[k]), "latency": statistics.median(lat[k])} for k in engines}
    return {
        **res,
        "ttft_ratio": res["on"]["ttft"] / res["off"]["ttft"],
        "latency_ratio": res["on"]["latency"] / res["off"]["latency"],
    }


def decode_tok_s(e: Engine, proc: Any, batch: int, steps: int) -> float:
    """Engine decode throughput with ``batch`` equal-length sequences decoding together."""
    items = make_items(proc, batch, seed=5)
    reqs = [
        GenerationRequest(
            f"d{i}-{time.time()}",
            [user(QUESTIONS0)],
            it.images,
            SamplingParams(max_tokens=steps + 1, ignore_eos=True),
        )
        for i, it in enumerate(items)
    ]
    ev = timed_events(e, reqs)
    start = max(evs[0][0] for evs in ev.values())  # every row has its first token
    end = max(evs[-1][0] for evs in ev.values())
    return batch * steps / (end - start)


QUESTIONS0 = "What colour is the circle?"


def efficiency(model: Any, proc: Any, steps: int, repeats: int) -> dict[str, Any]:
    e = engine(model, proc, max_batch=8)
    item = make_items(proc, 1, seed=5)[0]  # the same prompt as decode_tok_s's rows
    decode_tok_s(e, proc, 8, 4)  # warm-up: first forwards at new shapes are slow
    bare_decode_tok_s(model, item, 8, 4)
    eng, bare = [], []
    for _ in range(repeats):  # interleaved, best of: the CPU is shared with other work
        eng.append(decode_tok_s(e, proc, 8, steps))
        bare.append(bare_decode_tok_s(model, item, 8, steps))
    e.stop()
    return {"engine_tok_s": max(eng), "bare_tok_s": max(bare), "ratio": max(eng) / max(bare)}


def quantization(model_fp32: Any, proc: Any, large: bool, plan: Plan) -> dict[str, Any]:
    items = make_items(proc, plan.quant_n, seed=6)
    sampling = SamplingParams(max_tokens=plan.max_new)
    res: dict[str, Any] = {}
    ref: list[list[int]] = []
    for mode in plan.quant_modes:
        model = quantize_model(copy.deepcopy(model_fp32), mode) if large else load_bundled(mode)[0]
        e = engine(model, proc, max_batch=8)
        outs = [[t for ev in e.generate_sync(it.request(sampling)) for t in ev.token_ids] for it in items]
        ref = ref or outs
        exact = sum(a == b for a, b in zip(outs, ref, strict=True)) / len(outs)
        agree = [_prefix_agreement(a, b) for a, b in zip(outs, ref, strict=True)]
        tok_s = decode_tok_s(e, proc, 8, min(16, plan.efficiency_steps))
        e.stop()
        res[mode] = {
            "bytes": model_size_bytes(model),
            "decode_tok_s_b8": tok_s,
            "exact_match": exact,
            "token_agreement": statistics.fmean(agree),
        }
    return res


def _prefix_agreement(a: list[int], b: list[int]) -> float:
    n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return n / max(len(a), len(b), 1)


@dataclass(frozen=True)
class Plan:
    """How much of each section one run does: full (per model), ``--quick`` or ``--smoke``."""

    n: int  # requests per cache section
    clients: tuple[int, ...]
    reps: int  # best of, per throughput configuration
    max_new: int
    workload: int = 48  # distinct single questions (half as many two-turn conversations)
    warmup: int = 8
    min_conversations: int = 12
    efficiency_steps: int = 48
    efficiency_repeats: int = 3
    quant_n: int = 24
    quant_modes: tuple[str, ...] = QUANT_MODES

    def conversations(self, clients: int) -> int:
        """Six rounds per client: two were mostly the ramp (all clients' first prefill together,
        then their decodes), not the steady state a serving engine lives in."""
        return max(6 * clients, self.min_conversations)


def plan_for(mode: str, large: bool) -> Plan:
    if mode == "smoke":  # seconds: every code path once, nothing measured
        return Plan(
            2,
            (1, 8),
            1,
            2,
            workload=8,
            warmup=1,
            min_conversations=8,
            efficiency_steps=2,
            efficiency_repeats=1,
            quant_n=1,
        )
    if mode == "quick":
        return Plan(6, (1, 8), 1, 8 if large else 16, efficiency_steps=16, efficiency_repeats=2, quant_n=4)
    if large:
        return Plan(16, (1, 8), 2, 8, quant_n=8)
    return Plan(16, (1, 4, 8, 16), 3, 16)


def run_model(name: str, model: Any, proc: Any, plan: Plan, large: bool) -> dict[str, Any]:
    t0 = time.perf_counter()
    out: dict[str, Any] = {"params": sum(p.numel() for p in model.parameters())}
    out["throughput"] = throughput(model, proc, plan)
    out["prefix_ttft"] = prefix_ttft(model, proc, plan.n)
    out["session_turn2"] = session_turn2(model, proc, plan.n // 2 if large else plan.n, min(4, plan.max_new))
    out["image_ttft"] = image_ttft(model, proc, plan.n)
    out["efficiency"] = efficiency(model, proc, plan.efficiency_steps, plan.efficiency_repeats)
    out["quantization"] = quantization(model, proc, large, plan)
    out["seconds"] = time.perf_counter() - t0
    print(f"[{name}] done in {out['seconds']:.0f} s", flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short run: fewer requests and client counts")
    ap.add_argument("--smoke", action="store_true", help="seconds: every code path once (make test runs it)")
    ap.add_argument("--models", default="bundled,large", help="comma list of bundled,large")
    # 1 by default: on a 2-core machine shared with other work, 2 intra-op threads stall on each other
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON and chart")
    args = ap.parse_args(argv)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    model, proc = load_bundled()
    results: dict[str, Any] = {"meta": _meta(mode, args.threads)}
    for name in args.models.split(","):
        large = name != "bundled"
        m = build_large_glm(proc, small=args.smoke) if large else model
        results[name] = run_model(name, m, proc, plan_for(mode, large), large)
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = "" if mode == "full" else f"_{mode}"
    (args.out / f"engine_bench{suffix}.json").write_text(json.dumps(results, indent=2))
    print_table(results)
    save_chart(results, args.out / f"engine_bench{suffix}.png")


def _meta(mode: str, threads: int) -> dict[str, Any]:
    return {
        "model": str(bundled_model_path()),
        "mode": mode,
        "threads": threads,
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }


if __name__ == "__main__":
    main()
