"""Reading and cancelling jobs: the job record plus its event stream, as clients see them."""

from __future__ import annotations

import time
from typing import Any

from gateway.errors import APIError
from gateway.events import read_all, text_of
from gateway.state import GatewayState
from shared.jobs import JobRecord, finish_args
from shared.schemas import JobEvent, JobStatus, StageTimings

NOT_STARTED = {JobStatus.QUEUED, JobStatus.DECODING, JobStatus.WAITING}


def job_not_found(job_id: str) -> APIError:
    return APIError(404, f"job {job_id!r} not found (unknown or expired)", param="id", code="job_not_found")


async def load_record(state: GatewayState, job_id: str) -> JobRecord:
    raw = await state.redis.hgetall(state.keys.job(job_id))
    if not raw:
        raise APIError(
            404, f"job {job_id!r} not found (unknown or expired)", param="id", code="job_not_found"
        )
    return JobRecord.from_hash(raw)


async def job_view(state: GatewayState, job_id: str) -> dict[str, Any]:
    record = await load_record(state, job_id)
    events = await read_all(state.redis, state.keys, job_id)
    done = record.status == JobStatus.DONE
    text = record.text if done and record.text is not None else text_of(events)
    spec = record.spec
    return {
        "id": job_id,
        "object": "job",
        "status": record.status.value,
        "session_id": spec.session_id,
        "text": text,
        "final_text": record.text if done else None,
        "finish_reason": record.finish_reason,
        "error": record.error,
        "usage": _usage(record),
        "timings": (record.timings or StageTimings()).model_dump(),
        "attempt": record.attempt,
        "result_cached": record.result_cached,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "deadline": spec.deadline,
        "last_event_id": events[-1][0] if events else None,
    }


def _usage(record: JobRecord) -> dict[str, int] | None:
    if record.usage is None:
        return None
    return {**record.usage.model_dump(), "total_tokens": record.usage.total_tokens}


async def cancel_job(state: GatewayState, job_id: str) -> tuple[JobStatus, bool]:
    """Contract §Cancel. Returns (status now, whether it was finished here).

    The flag is set first, so a worker that picks the job up a moment later still sees it;
    a job not yet generating is finished here as cancelled (the Lua script refuses if a
    worker got to a terminal state first). A generating job leaves its batch at the next
    decode step and the worker writes ``cancelled``.
    """
    record = await load_record(state, job_id)
    if record.status == JobStatus.CANCELLED:
        return record.status, False  # idempotent
    if record.status.terminal:
        raise APIError(
            409, f"job already finished ({record.status.value}); nothing to cancel", code="job_finished"
        )
    keys, ttl = state.keys, state.settings.job_ttl_s
    await state.redis.set(keys.job_cancel(job_id), "1", ex=ttl)
    if record.status not in NOT_STARTED:
        return record.status, False
    event = JobEvent(type="status", status=JobStatus.CANCELLED, finish_reason="cancelled")
    args = finish_args(event, JobStatus.CANCELLED, time.time(), ttl)
    finished = await state.finish(
        keys=[keys.job(job_id), keys.job_events(job_id), keys.job_wake(job_id)], args=args
    )
    status: Any = await state.redis.hget(keys.job(job_id), "status")
    if status is None:  # expired between the two reads
        raise job_not_found(job_id)
    return JobStatus(status.decode() if isinstance(status, bytes) else status), bool(finished)
