"""Arguments of the job scripts, and the terminal event: built here, once, for every process.

A terminal state is written by ``FINISH_LUA`` with the terminal event it appends; every process
(gateway cancel or lazy expiry, decode worker, inference worker) builds that event with
``terminal_event`` and the script's KEYS/ARGV with ``finish_call``.
"""

from __future__ import annotations

import json
import time
from typing import Any

from shared.jobs.record import EVENTS_MAXLEN
from shared.keys import Keys
from shared.schemas import ErrorCode, EventType, JobEvent, JobStatus


def pipe_script(pipe: Any, source: str, keys: list[str], args: list[Any]) -> None:
    """Queue a script on a pipeline as ``EVAL`` of its source.

    redis-py's ``Script(..., client=pipe)`` queues ``EVALSHA`` and makes the pipeline ask
    ``SCRIPT EXISTS`` before every execute: one more round trip each time. ``EVAL`` of a script
    Redis has seen costs it a SHA1 of the text, and can never fail with ``NOSCRIPT`` (which would
    leave a MULTI half applied). Same replies as ``EVALSHA``.
    """
    pipe.eval(source, len(keys), *keys, *args)


def job_keys(keys: Keys, job_id: str) -> list[str]:
    """KEYS of every job script: job hash, events stream, wake channel, the active-jobs set."""
    return [keys.job(job_id), keys.job_events(job_id), keys.job_wake(job_id), keys.active_jobs()]


def _fence(fence: int | None) -> str:
    return "" if fence is None else str(fence)


def status_args(
    status: JobStatus, now: float, ttl_s: int, attempt: int = 1, fence: int | None = None
) -> list[str]:
    """ARGV for SET_STATUS_LUA (and the first six of HANDOFF_LUA)."""
    event = JobEvent(type="status", status=status, attempt=attempt)
    return [status.value, event.to_fields()["data"], str(now), str(ttl_s), str(EVENTS_MAXLEN), _fence(fence)]


def terminal_event(
    status: JobStatus, code: ErrorCode | str | None, error: str | None = None, attempt: int = 1
) -> JobEvent:
    """The event that ends a job that did not finish ``done`` (failed, cancelled, expired)."""
    kind: EventType = "error" if status is JobStatus.FAILED else "status"
    reason = "error" if kind == "error" else status.value
    return JobEvent(
        type=kind, attempt=attempt, status=status, finish_reason=reason, error=error, error_code=code
    )


def finish_args(
    event: JobEvent, status: JobStatus, now: float, ttl_s: int, fence: int | None = None
) -> list[str]:
    """ARGV for FINISH_LUA from the terminal event; ``fence``: the worker's attempt (None: gateway)."""
    extra: dict[str, str] = {"finish_reason": event.finish_reason or status.value}
    if event.error_code is not None:
        extra["error_code"] = event.error_code
    if event.final_text is not None:
        extra["text"] = event.final_text
    if event.error is not None:
        extra["error"] = event.error
    if event.usage is not None:
        extra["usage"] = event.usage.model_dump_json()
    if event.timings is not None:
        extra["timings"] = event.timings.model_dump_json()
    data = event.to_fields()["data"]
    return [status.value, data, str(now), str(ttl_s), str(EVENTS_MAXLEN), json.dumps(extra), _fence(fence)]


DEAD_LETTERS_MAXLEN = 10_000


def record_dead_letter(pipe: Any, keys: Keys, job_id: str, stage: str, attempts: int, reason: str) -> None:
    """Queue the dead-letter entry of a job failed for good (operators list and retry them)."""
    entry = {
        "job_id": job_id,
        "stage": stage,
        "attempts": str(attempts),
        "reason": reason,
        "ts": str(time.time()),
    }
    pipe.xadd(keys.dead_letters(), entry, maxlen=DEAD_LETTERS_MAXLEN, approximate=True)


def finish_call(
    keys: Keys, job_id: str, event: JobEvent, status: JobStatus, ttl_s: int, fence: int | None = None
) -> tuple[list[str], list[str]]:
    """(KEYS, ARGV) of FINISH_LUA writing ``event`` as the job's terminal state now."""
    return job_keys(keys, job_id), finish_args(event, status, time.time(), ttl_s, fence)
