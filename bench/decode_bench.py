"""The decode hop's JPEG draft mode: CPU per image and the model's answers at each oversample.

    python -m bench.decode_bench [--quick | --smoke] [--model PATH] [--out DIR]

Pillow's draft mode lets the JPEG decoder scale by 1/2, 1/4 or 1/8 in the DCT; the decode worker
asks for at least ``oversample`` x the processor's output resolution per axis, and the processor's
antialiased resize does the rest. For each setting (draft off = the full decode that
``transformers serve`` does; oversample 1.41, what 1.0 meant before the processor's budget was
measured; 1.0): the decode worker's CPU per image (decode + the processor's resize, one thread,
best of three per image), and the bundled model's answers to the service bench's requests (JPEG
320-1024 px, one question each, ground truth known) through the engine, greedy: accuracy and
agreement with the full decode. Writes bench/results/decode_bench.{json,md}.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import statistics
import time
from pathlib import Path
from typing import Any

import torch

import services  # noqa: F401  (registers the processor)
from bench.common import BUNDLED_MODEL, ROOT
from bench.report_files import write_report
from bench.service_bench import checkpoint_sha256
from bench.service_workload import MAX_TOKENS, BenchRequest, make_requests
from services.engine import Engine, EngineConfig
from services.inference_worker.engine_request import build_request, pixels_input
from services.vlm.image_processor import ImageProcessorHandle
from shared.schemas import ChatTurn, JobSpec, SamplingSpec
from shared.tensors import pack_image
from worker.imaging import decode_image

# "oversample 1.41": what 1.0 did until the processor's budget was measured (GLM-4V's configured
# budget counts two frames: twice the pixels it keeps).
SETTINGS: dict[str, float | None] = {
    "full decode": None,
    "oversample 1.41": math.sqrt(2),
    "oversample 1.0": 1.0,
}
MAX_PIXELS = 100_000_000


def decode(handle: ImageProcessorHandle, data: bytes, oversample: float | None) -> dict[str, torch.Tensor]:
    """What the decode worker ships for ``data`` under one setting."""
    img = decode_image(
        data, MAX_PIXELS, handle.target_pixels, draft=oversample is not None, oversample=oversample or 1.0
    )
    return handle.wire(img)


def cpu_ms_per_image(
    handle: ImageProcessorHandle, requests: list[BenchRequest], oversample: float | None
) -> dict[str, float]:
    best = []
    for req in requests:
        times = []
        for _ in range(3):
            start = time.process_time()
            decode(handle, req.image, oversample)
            times.append(time.process_time() - start)
        best.append(min(times) * 1000)
    return {"median": statistics.median(best), "mean": statistics.fmean(best)}


def answers(
    engine: Engine, handle: ImageProcessorHandle, requests: list[BenchRequest], setting: str
) -> list[str]:
    """The engine's answers; each setting's pictures under their own digest (no image-cache hits
    across settings)."""
    out = []
    for req in requests:
        wire = pack_image(handle.processor_id, decode(handle, req.image, SETTINGS[setting]))
        digest = hashlib.sha256(req.image + setting.encode()).hexdigest()
        spec = JobSpec(
            job_id=f"d{req.index}",
            created_at=time.time(),
            messages=[ChatTurn(role="user", text=req.question, image=True)],
            sampling=SamplingSpec(max_tokens=MAX_TOKENS),
        )
        request = build_request(spec, f"{setting}-{req.index}", pixels_input(handle, wire, digest))
        out.append("".join(e.text for e in engine.generate_sync(request, timeout_s=120)).strip())
    return out


def run(model: str, count: int) -> dict[str, Any]:
    torch.set_num_threads(1)
    requests = make_requests(count, seed=7)
    handle = ImageProcessorHandle.load(model)
    engine = Engine.from_pretrained(EngineConfig(model_path=model, device="cpu"))
    engine.start()
    try:
        said = {name: answers(engine, handle, requests, name) for name in SETTINGS}
    finally:
        engine.stop()
    rows = []
    for name, oversample in SETTINGS.items():
        right = sum(a == r.answer for a, r in zip(said[name], requests, strict=True))
        same = sum(a == b for a, b in zip(said[name], said["full decode"], strict=True))
        cpu = cpu_ms_per_image(handle, requests, oversample)
        rows.append({"setting": name, "cpu_ms": cpu, "accuracy": right / count, "same_as_full": same})
    return {"requests": count, "rows": rows}


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# Decode bench ({result['when']}, model sha256 {result['model_sha256'][:16]})",
        "",
        f"{result['requests']} JPEG requests (320-1024 px), one question each, greedy, "
        f"max_tokens {MAX_TOKENS}.",
        "",
        "| setting | CPU ms per image (median / mean) | accuracy | answers as with the full decode |",
        "|---|---|---|---|",
    ]
    for row in result["rows"]:
        cpu = row["cpu_ms"]
        lines.append(
            f"| {row['setting']} | {cpu['median']:.2f} / {cpu['mean']:.2f} | {100 * row['accuracy']:.1f} % "
            f"| {row['same_as_full']}/{result['requests']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="200 requests")
    parser.add_argument("--smoke", action="store_true", help="4 requests (make test)")
    parser.add_argument("--model", default=str(BUNDLED_MODEL))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    result = run(args.model, {"smoke": 4, "quick": 200, "full": 600}[mode])
    result |= {
        "mode": mode,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "model_sha256": checkpoint_sha256(args.model),
    }
    write_report(args.out, "decode_bench", mode, result, markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
