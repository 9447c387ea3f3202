"""A done job's figures into the metrics hash (``shared.metrics_hash.FAMILIES``): its stage
durations, time to first token, end-to-end latency, time between tokens and token counts.

Queued on the writer's side-effects pipeline: no round trip of its own."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from services.inference_worker.job_run import JobRun
from shared.metrics_hash import LATENCY_BUCKETS, TOKEN_BUCKETS, observe, observe_many
from shared.schemas import JobEvent

# StageTimings field -> (family, labels)
DURATIONS: dict[str, tuple[str, dict[str, str]]] = {
    "queue": ("request_queue_time_seconds", {"stage": "decode"}),
    "wait": ("request_queue_time_seconds", {"stage": "inference"}),
    "decode": ("request_image_decode_time_seconds", {}),
    "vision": ("request_vision_time_seconds", {}),
    "prefill": ("request_prefill_time_seconds", {}),
    "generation": ("request_decode_time_seconds", {}),
    "ttft": ("time_to_first_token_seconds", {}),
    "total": ("e2e_request_latency_seconds", {}),
}


def record_done(pipe: Any, key: str, run: JobRun, event: JobEvent) -> None:
    if event.timings is not None:
        for stage, seconds in event.timings.model_dump().items():
            if stage in DURATIONS:
                name, labels = DURATIONS[stage]
                observe(pipe, key, name, seconds, LATENCY_BUCKETS, **labels)
    if event.usage is not None:
        observe(pipe, key, "request_prompt_tokens", event.usage.prompt_tokens, TOKEN_BUCKETS)
        observe(pipe, key, "request_generation_tokens", event.usage.completion_tokens, TOKEN_BUCKETS)
    observe_many(pipe, key, "inter_token_latency_seconds", token_gaps(run.token_writes))


def token_gaps(writes: list[tuple[float, int]]) -> list[float]:
    """One gap a token after the first write: the time since the write before, shared by the tokens
    of the later write (several where the stream interval held steps: the engine's pace, not the
    interval's)."""
    gaps: list[float] = []
    for (before, _), (at, tokens) in pairwise(writes):
        gaps += [(at - before) / tokens] * tokens
    return gaps
