"""Caches and batching stay token-exact on a CUDA device: the bundled model's batched, prefix-cached
engine answers against the same model's batch-of-one ``generate`` on that device.

    python -m bench.gpu_exactness [--device cuda] [--modes none,bf16] [--requests 8]
    python -m bench.gpu_exactness --smoke      # CPU, fp32, three requests (a test runs it)

Greedy, end of sequence ignored (all requests run side by side to ``max_tokens``). Every second
request's picture is finished on the device from uint8 (``services.vlm.pixel_table``, as the inference
worker does there), and those pixel values are compared with the processor's. Reports per mode
how many answers match token for token and, where one diverges, the reference's logit gap there
(a near tie is the only excuse). Writes ``gpu_exactness{,_smoke}.json``.
"""

from __future__ import annotations

import argparse
import io
import json
import time
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from bench.common import draw_image, image_input
from bench.engine_workloads import QUESTIONS
from bench.service_bench import RESULTS
from services.engine import Engine, EngineConfig, GenerationRequest, SamplingParams
from services.inference_worker.engine_request import wire_input
from services.vlm.image_processor import ImageProcessorHandle
from services.vlm.loading import load_model
from services.vlm.pixel_table import PixelTable
from tests.services.engine.reference import reference, run_all, tokens_of, user

BUNDLED = Path(__file__).resolve().parent.parent / "models" / "vlmq-tiny"


def requests(processor: Any, n: int, max_tokens: int) -> list[tuple[GenerationRequest, bytes]]:
    """Every second request's picture as the inference worker hands it over with ``pixels_on_device``
    (the uint8 picture the engine finishes on its device), the others as the processor's values."""
    handle = ImageProcessorHandle.wrap(processor.image_processor)
    handle.table, handle.finish_on_device = PixelTable.build(handle), True
    out = []
    for i in range(n):
        png = draw_image(i, (64 + 16 * (i % 3), 64))
        sampling = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        messages = [user(QUESTIONS[i % len(QUESTIONS)])]
        image = image_input(processor, png)
        if i % 2:
            image = wire_input(handle, handle.wire(Image.open(io.BytesIO(png)).convert("RGB")), image.digest)
        out.append((GenerationRequest(f"r{i}", messages, [image], sampling), png))
    return out


def pixels_made_on_device(reqs: list[tuple[GenerationRequest, bytes]], processor: Any, device: str) -> int:
    """How many of the device-finished pictures equal the processor's own values, bit for bit."""
    same = 0
    for req, png in reqs:
        deferred = req.images[0].deferred
        if deferred is not None:
            made, own = deferred.make(torch.device(device)).cpu(), image_input(processor, png).pixel_values
            same += int(own is not None and torch.equal(made, own))
    return same


def compare(got: list[int], model: Any, processor: Any, req: GenerationRequest, png: bytes) -> dict[str, Any]:
    ref = reference(model, processor, req.messages, [png], req.sampling.max_tokens)
    got = got[: len(ref.tokens)]  # generate stops at EOS; the engine ran on
    diverged = next((i for i, (a, b) in enumerate(zip(got, ref.tokens, strict=False)) if a != b), None)
    gap = None
    if diverged is not None:
        top2 = ref.logits[diverged].topk(2).values
        gap = float(top2[0] - top2[1])
    return {"request": req.request_id, "match": diverged is None, "diverged_at": diverged, "logit_gap": gap}


def check_mode(mode: str, device: str, n: int, max_tokens: int) -> dict[str, Any]:
    model, processor = load_model(BUNDLED, mode, device)
    engine = Engine(model, processor, EngineConfig(max_batch=n, device=device))
    engine.prewarm()
    engine.start()
    try:
        reqs = requests(processor, n, max_tokens)
        engine.generate_sync(reqs[0][0])  # fills the prefix cache: the batch below reuses it
        batched = run_all(engine, [r for r, _ in reqs])
        rows = [compare(tokens_of(batched[r.request_id]), model, processor, r, png) for r, png in reqs]
        stats = engine.stats()
    finally:
        engine.stop(drain_timeout_s=5)
    return {
        "mode": mode,
        "matched": sum(r["match"] for r in rows),
        "requests": n,
        "pictures_on_device": sum(r.images[0].deferred is not None for r, _ in reqs),
        "pixels_equal": pixels_made_on_device(reqs, processor, device),
        "largest_batch": max(stats.batch_sizes),
        "largest_prefill": max(stats.prefill_sizes),  # > 1: both kinds of picture encoded together
        "rows": rows,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="CPU, fp32, three requests")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--modes", default="none,bf16", help="quantization modes to check")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.device, args.modes, args.requests = "cpu", "none", 3
    return args


def print_report(name: str, results: list[dict[str, Any]]) -> None:
    for r in results:
        print(f"{name} {r['mode']}: {r['matched']}/{r['requests']} token-identical", end="")
        print(f" (largest batch {r['largest_batch']}, prefill {r['largest_prefill']}); ", end="")
        print("pictures finished on the device: ", end="")
        print(f"{r['pixels_equal']}/{r['pictures_on_device']} equal to the processor's")
        for row in (row for row in r["rows"] if not row["match"]):
            gap = row["logit_gap"]
            print(f"  {row['request']} diverged at token {row['diverged_at']}, logit gap {gap:.2e}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = [check_mode(m, args.device, args.requests, args.max_tokens) for m in args.modes.split(",")]
    name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "CPU"
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"gpu_exactness{'_smoke' if args.smoke else ''}.json"
    path.write_text(json.dumps({"when": when, "device": name, "results": results}, indent=2))
    print_report(name, results)
    same = all(r["pixels_equal"] == r["pictures_on_device"] and r["largest_prefill"] > 1 for r in results)
    exact = same and all(r["matched"] == r["requests"] for r in results)
    return 0 if exact else 1


if __name__ == "__main__":
    raise SystemExit(main())
