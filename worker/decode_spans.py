"""The decode stage's spans (``shared.tracing``), recorded when the task ends: the wait in the
decode queue (accepted -> decode started) and the decode itself, under the job's stored context.
Only with tracing on: one HMGET of the job's spec and start time, nothing when the job is untraced."""

from __future__ import annotations

import logging
import time
from typing import Any

from opentelemetry.trace import SpanKind

from shared import tracing
from shared.keys import Keys
from shared.schemas import JobSpec

log = logging.getLogger(__name__)


def record(client: Any, keys: Keys, job_id: str, task_started: float, status: str, detail: str) -> None:
    if not tracing.enabled():
        return
    try:
        raw_spec, raw_started = client.hmget(keys.job(job_id), "spec", "decode_started_at")
    except Exception:  # tracing never fails a task
        log.debug("no decode spans for %s", job_id, exc_info=True)
        return
    if raw_spec is None:
        return
    spec = JobSpec.model_validate_json(raw_spec)
    started = float(raw_started) if raw_started else task_started
    tracing.record("vlmq.queue.decode", spec.traceparent, spec.created_at, started, job_id=job_id)
    tracing.record(
        "vlmq.decode",
        spec.traceparent,
        started,
        time.time(),
        SpanKind.CONSUMER,
        job_id=job_id,
        status=status,
        detail=detail or None,
    )
