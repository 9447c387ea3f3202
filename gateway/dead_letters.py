"""Dead letters: jobs failed for good after too many deliveries (decode or inference), listed for
operators, and retried as new jobs (a terminal job never changes: the retry gets its own id)."""

from __future__ import annotations

import time
from typing import Any

from gateway.accept import Accepted, accept_job
from gateway.errors import APIError
from gateway.job_records import ANY_TENANT, load_record
from gateway.job_spec import PreparedJob, new_id
from gateway.state import GatewayState
from shared.schemas import JobStatus
from shared.values import as_str


async def list_dead_letters(state: GatewayState, limit: int) -> list[dict[str, Any]]:
    """The newest ``limit`` entries, each with its job's current status (None once expired)."""
    entries: Any = await state.redis.xrevrange(state.keys.dead_letters(), count=limit)
    async with state.redis.pipeline(transaction=False) as pipe:
        for _id, fields in entries:
            pipe.hget(state.keys.job(as_str(fields.get(b"job_id", b""))), "status")
        statuses = await pipe.execute()
    out = []
    for (entry_id, fields), status in zip(entries, statuses, strict=True):
        item = {as_str(k): as_str(v) for k, v in fields.items()}
        out.append({"id": as_str(entry_id), **item, "status": as_str(status) if status else None})
    return out


async def retry_dead_letter(state: GatewayState, job_id: str) -> Accepted:
    """A new job with the failed job's request; admitted like any other (429 when full)."""
    record = await load_record(state, job_id, ANY_TENANT)  # an operator route
    if record.status is not JobStatus.FAILED:
        raise APIError(
            409, f"job {job_id} is {record.status.value}, not failed: nothing to retry", code="not_failed"
        )
    digest = record.spec.image_digest
    if digest is not None and not await state.redis.exists(state.keys.image(digest)):
        raise APIError(410, "the job's image has expired; submit it again", code="image_expired")
    now = time.time()
    spec = record.spec.model_copy(
        update={"job_id": new_id(), "created_at": now, "deadline": now + state.settings.max_job_s}
    )
    with state.metrics.submit_seconds.labels("retry").time():
        accepted = await accept_job(state, PreparedJob(spec=spec), use_result_cache=False)
    state.metrics.submitted.labels("retry").inc()
    return accepted
