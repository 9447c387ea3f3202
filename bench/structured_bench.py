"""Structured output's cost: ``python -m bench.structured_bench [--reps N]``.

Decode tokens/s of the engine on the bundled model, free text against JSON under a grammar
(``services/engine/grammar.py``), at batch 1 and batch 8, side by side in one process. Every
request generates exactly ``MAX_TOKENS`` tokens (free: ``ignore_eos``; constrained: a schema with
one long string, which the tiny model never closes), so both sides do the same forwards and the
difference is the grammar's work per step (mask fill, unpack, accept) plus the masked sampling.
Each configuration keeps its best of ``--reps`` runs (the CPU is shared). Results: a table on stdout
and ``bench/results/structured_bench.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

import torch

from bench.common import draw_image, image_input, load_bundled
from services.engine import Engine, EngineConfig, GenerationRequest, SamplingParams
from services.engine.api import StructuredOutput

RESULTS = Path(__file__).resolve().parent / "results"
MAX_TOKENS = 48
LONG_STRING = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
MODES: dict[str, StructuredOutput | None] = {
    "free": None,
    "json_schema": StructuredOutput("json_schema", json.dumps(LONG_STRING)),
}


def requests(proc: Any, batch: int, mode: str, rep: int) -> list[GenerationRequest]:
    structured = MODES[mode]
    sampling = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=structured is None, structured=structured)
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe it."}]}]
    return [
        GenerationRequest(f"{mode}-{batch}-{rep}-{i}", msgs, [image_input(proc, draw_image(i))], sampling)
        for i in range(batch)
    ]


def run_batch(engine: Engine, reqs: list[GenerationRequest]) -> tuple[int, float]:
    """(completion tokens, seconds from the first token to the last)."""
    import threading

    left = threading.Semaphore(0)
    first: list[float] = []
    tokens = 0

    def on_event(ev: Any) -> None:
        nonlocal tokens
        tokens += len(ev.token_ids)
        if not first:
            first.append(time.perf_counter())
        if ev.finished:
            left.release()

    for r in reqs:
        engine.submit(r, on_event)
    for _ in reqs:
        assert left.acquire(timeout=300)
    return tokens, time.perf_counter() - first[0]


def measure(engine: Engine, proc: Any, reps: int) -> dict[str, dict[str, float]]:
    best: dict[str, dict[str, float]] = {}
    for rep in range(reps):
        for batch in (1, 8):
            for mode in MODES:  # interleaved: a slow moment of the machine hits both sides
                tokens, seconds = run_batch(engine, requests(proc, batch, mode, rep))
                key = f"{mode}@{batch}"
                rate = (tokens - batch) / seconds  # the first token of each row comes from its prefill
                if rate > best.get(key, {}).get("tok_s", 0.0):
                    best[key] = {"tok_s": rate, "tokens": tokens, "seconds": seconds}
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(2)
    model, proc = load_bundled()
    engine = Engine(model, proc, EngineConfig(max_batch=8, batch_window_ms=50))
    engine.prewarm()
    engine.start()
    try:
        run_batch(engine, requests(proc, 8, "json_schema", -1))  # warm-up: token table, compile
        best = measure(engine, proc, args.reps)
    finally:
        engine.stop()
    print(f"{'batch':>5} {'free tok/s':>11} {'json tok/s':>11} {'json/free':>9}")
    for batch in (1, 8):
        free, constrained = best[f"free@{batch}"]["tok_s"], best[f"json_schema@{batch}"]["tok_s"]
        print(f"{batch:>5} {free:>11.1f} {constrained:>11.1f} {constrained / free:>9.2f}")
    RESULTS.mkdir(exist_ok=True)
    out = {"machine": platform.machine(), "max_tokens": MAX_TOKENS, "reps": args.reps, "results": best}
    (RESULTS / "structured_bench.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
