"""Dummy requests through the engine before the worker takes jobs (``VLMQ_WARMUP_REQUESTS``).

On a GPU the first forwards at each new shape load kernels lazily: in the GPU bench the first
requests after start waited ~1 s for their first token against ~0.1 s later (bench/README.md, "On
a GPU"). The dummies bypass the caches, and the engine's counters forget them.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from typing import Any

from PIL import Image

from services.engine import Engine, FinishReason, GenerationRequest, ImageInput, SamplingParams, TokenEvent
from services.inference_worker.engine_request import wire_input
from services.vlm.image_processor import ImageProcessorHandle

log = logging.getLogger(__name__)

# Questions of several lengths: the prefill shapes (and so the kernels) differ with the prompt's length.
QUESTIONS = (
    "What is this?",
    "What colour is the largest shape in the picture?",
    "Describe the picture: every object, its colour, its size and where it is, from left to right.",
)
GREY = (128, 128, 128)


def blank_image(engine: Engine, pixels: ImageProcessorHandle) -> ImageInput | None:
    """A grey square the way a job's picture arrives: the decode worker's wire form, handed to the
    engine as a job's is (``engine_request.wire_input``: finished when the engine encodes it, on its
    device or by the processor, where the processor's steps are a table); None for a model without
    an image processor."""
    if engine.image_processor is None:
        return None
    picture = Image.new("RGB", (224, 224), GREY)
    digest = hashlib.sha256(picture.tobytes()).hexdigest()
    return wire_input(pixels, pixels.wire(picture), digest)


def warmup_requests(
    engine: Engine, pixels: ImageProcessorHandle, n: int, max_tokens: int = 4
) -> list[GenerationRequest]:
    image = blank_image(engine, pixels)
    parts: list[dict[str, Any]] = [{"type": "image"}] if image is not None else []
    sampling = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return [
        GenerationRequest(
            f"warmup-{i}",
            [{"role": "user", "content": [*parts, {"type": "text", "text": QUESTIONS[i % len(QUESTIONS)]}]}],
            [image] if image is not None else [],
            sampling,
            use_cache=False,
        )
        for i in range(n)
    ]


def run_together(engine: Engine, requests: list[GenerationRequest], timeout_s: float) -> None:
    """Submit all at once (they share prefills and decode steps) and wait until every one ended."""
    left = threading.Semaphore(0)
    ends: list[TokenEvent] = []

    def callback(event: TokenEvent) -> None:
        if event.finished:
            ends.append(event)
            left.release()

    refused = engine.submit_many([(request, callback) for request in requests])
    deadline = time.monotonic() + timeout_s
    for _ in range(sum(r is None for r in refused)):
        if not left.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise TimeoutError("warm-up requests did not finish in time")
    for end in ends:
        raise_if_failed(end)


def raise_if_failed(end: TokenEvent) -> None:
    """A dummy the engine refused or failed: the warm-up did not warm anything up."""
    if end.finish_reason in (FinishReason.REJECTED, FinishReason.ERROR):
        raise RuntimeError(f"warm-up request {end.request_id} ended {end.finish_reason}: {end.error}")


def warm_up(engine: Engine, pixels: ImageProcessorHandle, n: int, timeout_s: float = 300.0) -> float:
    """Run ``n`` dummy requests (the first alone, then the rest as one batch); seconds taken.
    A failure is logged, not raised: the warm-up only saves the first jobs time, and an engine that
    cannot serve shows it in its health like any other step failure."""
    if n <= 0:
        return 0.0
    started = time.perf_counter()
    try:
        first, *rest = warmup_requests(engine, pixels, n)
        raise_if_failed(engine.generate_sync(first, timeout_s)[-1])
        if rest:
            run_together(engine, rest, timeout_s)
    except Exception:
        log.warning("warm-up failed; serving without it", exc_info=True)
    engine.forget_counters()
    took = time.perf_counter() - started
    log.info("warm-up: %d dummy requests in %.2f s", n, took)
    return took
