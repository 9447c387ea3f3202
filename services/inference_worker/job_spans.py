"""The inference stage's spans (``shared.tracing``), recorded when an attempt ends: the wait for
the engine (tensor ready -> in a batch: the stream and the engine's queue), and ``vlmq.inference``
(handed to the engine -> end) with the engine's vision, prefill and generation laid out in it
from the job's stage timings. Under the job's stored context; nothing when tracing is off."""

from __future__ import annotations

import time

from opentelemetry.trace import SpanKind

from services.inference_worker.after_finish import Finished
from shared import tracing
from shared.schemas import StageTimings


def record(item: Finished, worker_id: str) -> None:
    run = item.run
    if not tracing.enabled() or not run.spec.traceparent:
        return
    end, job = time.time(), run.job_id
    timings = item.event.timings or StageTimings()
    ready = run.waiting_at or run.submitted_at
    parent = run.spec.traceparent
    tracing.record("vlmq.queue.inference", parent, ready, ready + timings.wait, job_id=job)
    usage = item.event.usage
    stage = tracing.record(
        "vlmq.inference",
        parent,
        run.submitted_at,
        end,
        SpanKind.CONSUMER,
        job_id=job,
        attempt=run.attempt,
        worker=worker_id,
        status=item.status.value if item.wrote else "superseded",
        completion_tokens=usage.completion_tokens if usage else None,
        cached_tokens=usage.cached_tokens if usage else None,
    )
    inner, start = tracing.traceparent_of(stage), ready + timings.wait
    for name, seconds in (("vision", timings.vision), ("prefill", timings.prefill)):
        tracing.record(f"vlmq.{name}", inner, start, start + seconds, job_id=job)
        start += seconds
    tracing.record("vlmq.generation", inner, end - timings.generation, end, job_id=job)
