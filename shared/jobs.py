"""The job record and its event stream: the one protocol every process writes.

A job is a Redis hash (``Keys.job``) plus an event stream (``Keys.job_events``). State
changes go through the Lua scripts below so that they are atomic and a terminal state is
written exactly once, whoever (gateway cancel, decode worker, inference worker, a retried
attempt) gets there first. Both scripts append the matching event to the job's stream and
publish a wake-up on ``Keys.job_wake`` (pub/sub only wakes; the stream holds the data).

The scripts run on sync and asyncio clients alike: ``client.register_script(SRC)``.

Hash fields: ``spec`` (JobSpec JSON), ``status``, ``attempt``, ``created_at``, ``updated_at``,
``text`` (final text), ``finish_reason``, ``error``, ``usage`` (JSON), ``timings`` (JSON),
``result_cached`` ("1" when answered from the result cache), ``error_code`` (machine-readable
reason of a failed/expired/cancelled job: ``bad_image``, ``expired``, ``cancelled``, ``internal``,
...), ``finished_attempt`` (the attempt whose FINISH wrote the terminal state).

Fencing: worker-side calls pass their attempt number (``fence``); the scripts refuse when the
hash's ``attempt`` differs (a newer attempt owns the job). Gateway calls pass no fence.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from shared.keys import Keys
from shared.schemas import JobEvent, JobSpec, JobStatus, StageTimings, UsageInfo
from shared.values import as_str

# Lua: true when a status string is terminal (every script below uses it).
IS_TERMINAL_LUA = """
local function is_terminal(s)
  return s == 'done' or s == 'failed' or s == 'cancelled' or s == 'expired'
end
"""

# Lua: true when ARGV[n] is a fence (attempt number) that is not the job's current attempt.
FENCED_LUA = """
local function fenced(n)
  return ARGV[n] ~= nil and ARGV[n] ~= '' and redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[n]
end
"""

# KEYS: job hash, events stream, wake channel. ARGV: new status, event fields JSON, now, ttl, maxlen,
# fence. Refuses (returns 0) when the job is gone, terminal or fenced; else sets status, appends event.
SET_STATUS_LUA = (
    IS_TERMINAL_LUA
    + FENCED_LUA
    + """
local status = redis.call('HGET', KEYS[1], 'status')
if not status or is_terminal(status) or fenced(6) then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'updated_at', ARGV[3])
local id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', 'data', ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[4])
redis.call('PUBLISH', KEYS[3], id)
return 1
"""
)

# Same refusal rule; ARGV[6] is a flat JSON object of extra hash fields (text, usage, ...), ARGV[7]
# the fence. Returns 1 when written, 2 when this same attempt already wrote it (a re-sent FINISH
# after a lost reply: idempotent), 0 when gone or already terminal, -1 when another attempt owns it.
FINISH_LUA = (
    IS_TERMINAL_LUA
    + FENCED_LUA
    + """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return 0 end
if fenced(7) then return -1 end
if is_terminal(status) then
  if ARGV[7] ~= '' and redis.call('HGET', KEYS[1], 'finished_attempt') == ARGV[7] then return 2 end
  return 0
end
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'updated_at', ARGV[3])
if ARGV[7] ~= '' then redis.call('HSET', KEYS[1], 'finished_attempt', ARGV[7]) end
local extra = cjson.decode(ARGV[6])
for k, v in pairs(extra) do redis.call('HSET', KEYS[1], k, v) end
local id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', 'data', ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('EXPIRE', KEYS[2], ARGV[4])
redis.call('PUBLISH', KEYS[3], id)
return 1
"""
)

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
    error_code: str | None = None
    usage: UsageInfo | None = None
    timings: StageTimings | None = None
    result_cached: bool = False

    @classmethod
    def from_hash(cls, raw: dict[Any, Any]) -> JobRecord:
        fields = {as_str(k): as_str(v) for k, v in raw.items()}
        return cls(
            spec=JobSpec.model_validate_json(fields["spec"]),
            status=JobStatus(fields["status"]),
            attempt=int(fields.get("attempt", 0)),
            created_at=float(fields["created_at"]),
            updated_at=float(fields.get("updated_at", fields["created_at"])),
            text=fields.get("text"),
            finish_reason=fields.get("finish_reason"),
            error=fields.get("error"),
            error_code=fields.get("error_code"),
            usage=UsageInfo.model_validate_json(fields["usage"]) if "usage" in fields else None,
            timings=StageTimings.model_validate_json(fields["timings"]) if "timings" in fields else None,
            result_cached=fields.get("result_cached") == "1",
        )


def new_job_hash(spec: JobSpec) -> dict[str, str]:
    """Fields of a freshly accepted job (status queued)."""
    now = str(spec.created_at)
    return {
        "spec": spec.model_dump_json(),
        "status": JobStatus.QUEUED.value,
        "attempt": "0",
        "created_at": now,
        "updated_at": now,
    }


def pipe_script(pipe: Any, source: str, keys: list[str], args: list[Any]) -> None:
    """Queue a script on a pipeline as ``EVAL`` of its source.

    redis-py's ``Script(..., client=pipe)`` queues ``EVALSHA`` and makes the pipeline ask
    ``SCRIPT EXISTS`` before every execute: one more round trip each time. ``EVAL`` of a script
    Redis has seen costs it a SHA1 of the text, and can never fail with ``NOSCRIPT`` (which would
    leave a MULTI half applied). Same replies as ``EVALSHA``.
    """
    pipe.eval(source, len(keys), *keys, *args)


def job_keys(keys: Keys, job_id: str) -> list[str]:
    """KEYS of every job script: job hash, events stream, wake channel."""
    return [keys.job(job_id), keys.job_events(job_id), keys.job_wake(job_id)]


def _fence(fence: int | None) -> str:
    return "" if fence is None else str(fence)


def status_args(
    status: JobStatus, now: float, ttl_s: int, attempt: int = 1, fence: int | None = None
) -> list[str]:
    event = JobEvent(type="status", status=status, attempt=attempt)
    return [status.value, event.to_fields()["data"], str(now), str(ttl_s), str(EVENTS_MAXLEN), _fence(fence)]


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
