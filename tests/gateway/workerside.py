"""Playing the workers' part in gateway tests: read the decode queue, write job state and
events the way workers do (shared Lua scripts, ``JobEvent`` entries), nothing else."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import redis

from shared import conversations
from shared.jobs import EVENTS_MAXLEN, FINISH_LUA, SET_STATUS_LUA, finish_args, job_keys, status_args
from shared.keys import Keys
from shared.schemas import JobEvent, JobSpec, JobStatus, StageTimings, UsageInfo


def queue_key(prefix: str) -> str:
    return Keys(prefix).decode_queue()


def decode_tasks(r: redis.Redis, prefix: str) -> list[str]:
    """Job ids of the ``vlmq.decode`` tasks waiting in the Celery queue."""
    ids = []
    for raw in r.lrange(queue_key(prefix), 0, -1):
        message = json.loads(raw)
        assert message["headers"]["task"] == "vlmq.decode"
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        ids.append(args[0])
    return ids


def stream_jobs(r: redis.Redis, stream: str) -> list[str]:
    """Job ids of the entries in an inference stream (text-only jobs skip the decode queue)."""
    entries: Any = r.xrange(stream)
    return [fields[b"job_id"].decode() for _, fields in entries]


def set_status(r: redis.Redis, keys: Keys, job_id: str, status: JobStatus, attempt: int = 1) -> bool:
    args = status_args(status, time.time(), 3600, attempt)
    return bool(r.eval(SET_STATUS_LUA, 4, *job_keys(keys, job_id), *args))


def emit_token(r: redis.Redis, keys: Keys, job_id: str, text: str, index: int, attempt: int = 1) -> str:
    event = JobEvent(type="token", attempt=attempt, text=text, token_ids=[100 + index], index=index)
    fields: dict[Any, Any] = dict(event.to_fields())
    entry_id: Any = r.xadd(keys.job_events(job_id), fields, maxlen=EVENTS_MAXLEN, approximate=True)
    r.publish(keys.job_wake(job_id), entry_id)
    return entry_id.decode()


def finish_done(
    r: redis.Redis, keys: Keys, job_id: str, text: str, attempt: int = 1, completion_tokens: int = 0
) -> bool:
    usage = UsageInfo(prompt_tokens=120, completion_tokens=completion_tokens or len(text), cached_tokens=100)
    timings = StageTimings(
        queue=0.01,
        decode=0.02,
        wait=0.003,
        vision=0.004,
        prefill=0.005,
        generation=0.05,
        ttft=0.04,
        total=0.1,
    )
    event = JobEvent(
        type="done", attempt=attempt, final_text=text, finish_reason="stop", usage=usage, timings=timings
    )
    args = finish_args(event, JobStatus.DONE, time.time(), 3600)
    return bool(r.eval(FINISH_LUA, 4, *job_keys(keys, job_id), *args))


def finish_failed(r: redis.Redis, keys: Keys, job_id: str, error: str, code: str | None = None) -> bool:
    event = JobEvent(type="error", error=error, finish_reason="error", error_code=code)
    args = finish_args(event, JobStatus.FAILED, time.time(), 3600)
    return bool(r.eval(FINISH_LUA, 4, *job_keys(keys, job_id), *args))


def record_turn(r: redis.Redis, keys: Keys, spec: JobSpec, answer: str) -> bool:
    """What the inference worker does on done: compare-and-append the turn to the session."""
    pipe = r.pipeline()
    conversations.record_turn(pipe, keys, spec, answer, 600)
    return bool(pipe.execute()[0])


def run_job(r: redis.Redis, keys: Keys, job_id: str, pieces: list[str], attempt: int = 1) -> list[str]:
    """A whole successful run: generating, one token event per piece, done. Returns event ids."""
    set_status(r, keys, job_id, JobStatus.GENERATING, attempt)
    ids = [emit_token(r, keys, job_id, p, i, attempt) for i, p in enumerate(pieces)]
    finish_done(r, keys, job_id, "".join(pieces), attempt, completion_tokens=len(pieces))
    return ids
