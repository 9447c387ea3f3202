"""The job record and its event stream: the one protocol every process writes.

A job is a Redis hash (``Keys.job``) plus an event stream (``Keys.job_events``). State
changes go through the Lua scripts below so that they are atomic and a terminal state is
written exactly once, whoever (gateway cancel, decode worker, inference worker, a retried
attempt) gets there first. Both scripts append the matching event to the job's stream and
publish a wake-up on ``Keys.job_wake`` (pub/sub only wakes; the stream holds the data).

The scripts run on sync and asyncio clients alike: ``client.register_script(SRC)``.

Hash fields: ``spec`` (JobSpec JSON), ``status``, ``attempt``, ``created_at``, ``updated_at``,
``text`` (final text), ``finish_reason``, ``error``, ``usage`` (JSON), ``timings`` (JSON),
``result_cached`` ("1" when answered from the result cache).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from shared.schemas import JobEvent, JobSpec, JobStatus, StageTimings, UsageInfo

# KEYS: job hash, events stream, wake channel. ARGV: new status, event fields JSON, now, ttl, maxlen.
# Refuses (returns 0) when the job is gone or already terminal; else sets status, appends event.
SET_STATUS_LUA = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return 0 end
if status == 'done' or status == 'failed' or status == 'cancelled' or status == 'expired' then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'updated_at', ARGV[3])
local id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', 'data', ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[4])
redis.call('PUBLISH', KEYS[3], id)
return 1
"""

# Same refusal rule; ARGV[6] is a flat JSON object of extra hash fields (text, usage, ...).
FINISH_LUA = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return 0 end
if status == 'done' or status == 'failed' or status == 'cancelled' or status == 'expired' then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'updated_at', ARGV[3])
local extra = cjson.decode(ARGV[6])
for k, v in pairs(extra) do redis.call('HSET', KEYS[1], k, v) end
local id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', 'data', ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('EXPIRE', KEYS[2], ARGV[4])
redis.call('PUBLISH', KEYS[3], id)
return 1
"""

EVENTS_MAXLEN = 100_000  # a job's event stream never grows without bound


class JobRecord(BaseModel):
    """The job hash, parsed."""

    spec: JobSpec
    status: JobStatus
    attempt: int = 0
    created_at: float
    updated_at: float
    text: str | None = None
    finish_reason: str | None = None
    error: str | None = None
    usage: UsageInfo | None = None
    timings: StageTimings | None = None
    result_cached: bool = False

    @classmethod
    def from_hash(cls, raw: dict[Any, Any]) -> JobRecord:
        fields = {_s(k): _s(v) for k, v in raw.items()}
        return cls(
            spec=JobSpec.model_validate_json(fields["spec"]),
            status=JobStatus(fields["status"]),
            attempt=int(fields.get("attempt", 0)),
            created_at=float(fields["created_at"]),
            updated_at=float(fields.get("updated_at", fields["created_at"])),
            text=fields.get("text"),
            finish_reason=fields.get("finish_reason"),
            error=fields.get("error"),
            usage=UsageInfo.model_validate_json(fields["usage"]) if "usage" in fields else None,
            timings=StageTimings.model_validate_json(fields["timings"]) if "timings" in fields else None,
            result_cached=fields.get("result_cached") == "1",
        )


def new_job_hash(spec: JobSpec) -> dict[str, str]:
    """Fields of a freshly accepted job (status queued)."""
    now = str(spec.created_at)
    return {"spec": spec.model_dump_json(), "status": JobStatus.QUEUED.value, "attempt": "0",
            "created_at": now, "updated_at": now}


def status_args(status: JobStatus, now: float, ttl_s: int, attempt: int = 1) -> list[str]:
    event = JobEvent(type="status", status=status, attempt=attempt)
    return [status.value, event.to_fields()["data"], str(now), str(ttl_s), str(EVENTS_MAXLEN)]


def finish_args(event: JobEvent, status: JobStatus, now: float, ttl_s: int) -> list[str]:
    """ARGV for FINISH_LUA from the terminal event (done or error)."""
    extra: dict[str, str] = {"finish_reason": event.finish_reason or status.value}
    if event.final_text is not None:
        extra["text"] = event.final_text
    if event.error is not None:
        extra["error"] = event.error
    if event.usage is not None:
        extra["usage"] = event.usage.model_dump_json()
    if event.timings is not None:
        extra["timings"] = event.timings.model_dump_json()
    return [status.value, event.to_fields()["data"], str(now), str(ttl_s), str(EVENTS_MAXLEN), json.dumps(extra)]


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
