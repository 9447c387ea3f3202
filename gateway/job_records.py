"""Reading and cancelling jobs: the job record plus its event stream, as clients see them.

Terminal states the gateway writes (cancel before start, lazy expiry, enqueue failure) go through
``finish_job``: FINISH_LUA without a fence, plus ``jobs_total{outcome}`` when it wrote.
"""

from __future__ import annotations

from typing import Any

from gateway.errors import APIError
from gateway.event_reader import read_all, text_of
from gateway.state import GatewayState
from shared import metrics_hash
from shared.jobs import JobRecord, finish_call, past_deadline, terminal_event
from shared.schemas import ErrorCode, JobStatus, StageTimings
from shared.values import as_str

NOT_STARTED = {JobStatus.QUEUED, JobStatus.DECODING, JobStatus.WAITING}


def job_not_found(job_id: str) -> APIError:
    return APIError(404, f"job {job_id!r} not found (unknown or expired)", param="id", code="job_not_found")


class _AnyTenant:
    """Reads of a job this gateway just made for the caller, and operator routes."""


ANY_TENANT = _AnyTenant()
Owner = str | None | _AnyTenant  # the tenant asking (None: an open gateway)


async def load_record(state: GatewayState, job_id: str, tenant: Owner) -> JobRecord:
    """The job, if ``tenant`` made it: another tenant's job is as unknown as a missing one (404)."""
    raw = await state.redis.hgetall(state.keys.job(job_id))
    if not raw:
        raise job_not_found(job_id)
    record = JobRecord.from_hash(raw)
    if tenant is not ANY_TENANT and record.spec.tenant != tenant:
        raise job_not_found(job_id)
    return record


async def finish_job(
    state: GatewayState, job_id: str, status: JobStatus, code: ErrorCode, error: str | None = None
) -> bool:
    """Write a terminal state from the gateway (refused when already terminal); count it."""
    event = terminal_event(status, code, error)
    keys, args = finish_call(state.keys, job_id, event, status, state.settings.job_ttl_s)
    if await state.finish(keys=keys, args=args) != 1:
        return False
    await count_outcome(state, status)
    return True


async def count_outcome(state: GatewayState, status: JobStatus) -> None:
    """``jobs_total{outcome}`` in the workers' metrics hash, for outcomes the gateway writes."""
    field = metrics_hash.series("jobs_total", outcome=status.value)
    await state.redis.hincrby(state.keys.metrics_counters(), field, 1)


async def expire_if_due(state: GatewayState, record: JobRecord) -> bool:
    """Lazy expiry: a job not yet generating and past its deadline is expired when read."""
    if record.status not in NOT_STARTED or not past_deadline(record.spec):
        return False
    error = "deadline passed before the job started"
    return await finish_job(state, record.spec.job_id, JobStatus.EXPIRED, ErrorCode.EXPIRED, error)


async def current_record(state: GatewayState, job_id: str, tenant: Owner) -> JobRecord:
    """The record, after lazy expiry."""
    record = await load_record(state, job_id, tenant)
    if await expire_if_due(state, record):
        record = await load_record(state, job_id, tenant)
    return record


async def job_view(state: GatewayState, job_id: str, tenant: Owner) -> dict[str, Any]:
    record = await current_record(state, job_id, tenant)
    events = await read_all(state.redis, state.keys, job_id)
    done = record.status == JobStatus.DONE
    text = record.text if done and record.text is not None else text_of(events)
    spec = record.spec
    return {
        "id": job_id,
        "object": "job",
        "status": record.status.value,
        "session_id": spec.conversation_id or spec.affinity_key,
        "text": text,
        "final_text": record.text if done else None,
        "finish_reason": record.finish_reason,
        "error": record.error,
        "error_code": record.error_code,
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


async def cancel_job(state: GatewayState, job_id: str, tenant: Owner) -> tuple[JobStatus, bool]:
    """Contract §Cancel. Returns (status now, whether it was finished here).

    The flag is set first, so a worker that picks the job up a moment later still sees it;
    a job not yet generating is finished here as cancelled (the Lua script refuses if a
    worker got to a terminal state first). A generating job leaves its batch at the next
    decode step and the worker writes ``cancelled``.
    """
    record = await load_record(state, job_id, tenant)
    if record.status == JobStatus.CANCELLED:
        return record.status, False  # idempotent
    if record.status.terminal:
        raise APIError(
            409, f"job already finished ({record.status.value}); nothing to cancel", code="job_finished"
        )
    keys = state.keys
    await state.redis.set(keys.job_cancel(job_id), "1", ex=state.settings.job_ttl_s)
    if record.status not in NOT_STARTED:
        return record.status, False
    finished = await finish_job(state, job_id, JobStatus.CANCELLED, ErrorCode.CANCELLED)
    status: Any = await state.redis.hget(keys.job(job_id), "status")
    if status is None:  # expired between the two reads
        raise job_not_found(job_id)
    return JobStatus(as_str(status)), finished
