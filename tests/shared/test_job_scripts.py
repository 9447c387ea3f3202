"""The job state machine's Lua scripts against a real Redis: each refusal and each idempotent retry."""

from __future__ import annotations

import json
import time
from typing import Any

from shared.jobs import (
    APPEND_TOKENS_LUA,
    BEGIN_ATTEMPT_LUA,
    DEL_IF_OWNER_LUA,
    EVENTS_MAXLEN,
    FINISH_LUA,
    HANDOFF_LUA,
    RETURN_TO_DECODING_LUA,
    ROUTE_HOLDER_LUA,
    SET_STATUS_LUA,
    finish_call,
    job_keys,
    new_job_hash,
    status_args,
    terminal_event,
)
from shared.keys import Keys
from shared.schemas import ErrorCode, JobEvent, JobStatus
from tests.support.jobs import make_spec


def new_job(r: Any, keys: Keys, status: str = "queued", attempt: int = 0) -> str:
    spec = make_spec()
    r.hset(keys.job(spec.job_id), mapping={**new_job_hash(spec), "status": status, "attempt": attempt})
    return spec.job_id


def events(r: Any, keys: Keys, job_id: str) -> list[JobEvent]:
    return [JobEvent.from_fields(f) for _, f in r.xrange(keys.job_events(job_id))]


def set_status(r: Any, keys: Keys, job_id: str, status: JobStatus, fence: int | None = None) -> int:
    args = status_args(status, time.time(), 60, fence=fence)
    return int(r.eval(SET_STATUS_LUA, 4, *job_keys(keys, job_id), *args))


def finish(r: Any, keys: Keys, job_id: str, status: JobStatus, fence: int | None = None) -> int:
    event = terminal_event(status, ErrorCode.INTERNAL if status is JobStatus.FAILED else None, "why")
    script_keys, args = finish_call(keys, job_id, event, status, 60, fence)
    return int(r.eval(FINISH_LUA, 4, *script_keys, *args))


def test_set_status_moves_a_live_job_and_refuses_gone_terminal_or_fenced(
    redis_client: Any, keys: Keys
) -> None:
    r = redis_client
    job_id = new_job(r, keys, attempt=1)
    with r.pubsub() as sub:
        sub.subscribe(keys.job_wake(job_id))
        assert set_status(r, keys, job_id, JobStatus.DECODING) == 1
        assert sub.get_message(timeout=1)["type"] == "subscribe"
        assert sub.get_message(timeout=1)["type"] == "message"  # listeners are woken
    assert r.hget(keys.job(job_id), "status") == b"decoding"
    assert [e.status for e in events(r, keys, job_id)] == [JobStatus.DECODING]
    assert set_status(r, keys, job_id, JobStatus.WAITING, fence=2) == 0  # attempt 2 does not own it
    assert set_status(r, keys, "no-such-job", JobStatus.WAITING) == 0
    assert finish(r, keys, job_id, JobStatus.CANCELLED) == 1
    assert set_status(r, keys, job_id, JobStatus.GENERATING) == 0  # terminal is final


def test_finish_writes_once_and_answers_a_resent_finish(redis_client: Any, keys: Keys) -> None:
    r = redis_client
    job_id = new_job(r, keys, status="generating", attempt=2)
    assert finish(r, keys, job_id, JobStatus.FAILED, fence=1) == -1  # an older attempt
    assert finish(r, keys, job_id, JobStatus.FAILED, fence=2) == 1
    assert finish(r, keys, job_id, JobStatus.FAILED, fence=2) == 2  # same attempt, reply lost: idempotent
    assert finish(r, keys, job_id, JobStatus.CANCELLED) == 0  # the gateway comes too late
    record = {k.decode(): v.decode() for k, v in r.hgetall(keys.job(job_id)).items()}
    assert record["status"] == "failed" and record["error"] == "why" and record["error_code"] == "internal"
    assert record["finished_attempt"] == "2"
    assert [e.type for e in events(r, keys, job_id)] == ["error"]  # one terminal event
    assert 0 < r.ttl(keys.job(job_id)) <= 60 and 0 < r.ttl(keys.job_events(job_id)) <= 60
    assert finish(r, keys, "no-such-job", JobStatus.FAILED) == 0


def test_handoff_enqueues_once_from_queued_or_decoding(redis_client: Any, keys: Keys) -> None:
    r = redis_client
    job_id = new_job(r, keys, status="decoding")
    args = [*status_args(JobStatus.WAITING, time.time(), 60), job_id, b"pixels", 30]
    script_keys = [*job_keys(keys, job_id), keys.inference_stream(), keys.job_pixels(job_id)]
    assert r.eval(HANDOFF_LUA, 6, *script_keys, *args) == 1
    assert r.get(keys.job_pixels(job_id)) == b"pixels" and 0 < r.ttl(keys.job_pixels(job_id)) <= 30
    r.delete(keys.job_pixels(job_id))
    assert r.eval(HANDOFF_LUA, 6, *script_keys, *args) == 0  # a redelivered decode task
    assert not r.exists(keys.job_pixels(job_id))  # writes nothing, pixels included
    assert [f[b"job_id"] for _, f in r.xrange(keys.inference_stream())] == [job_id.encode()]
    assert r.hget(keys.job(job_id), "status") == b"waiting" and r.hexists(keys.job(job_id), "waiting_at")


def test_handoff_without_an_image_stores_no_pixels(redis_client: Any, keys: Keys) -> None:
    r = redis_client
    job_id = new_job(r, keys, status="decoding")
    args = [*status_args(JobStatus.WAITING, time.time(), 60), job_id]
    assert r.eval(HANDOFF_LUA, 5, *job_keys(keys, job_id), keys.inference_stream(), *args) == 1
    assert not r.exists(keys.job_pixels(job_id))


def test_a_terminal_job_loses_its_pixels(redis_client: Any, keys: Keys) -> None:
    r = redis_client
    job_id = new_job(r, keys, status="generating")
    r.set(keys.job_pixels(job_id), b"pixels")
    assert finish(r, keys, job_id, JobStatus.DONE) == 1
    assert not r.exists(keys.job_pixels(job_id))


def test_begin_attempt_counts_deliveries_and_reads_the_cancel_flag(redis_client: Any, keys: Keys) -> None:
    r = redis_client
    job_id = new_job(r, keys, status="waiting")
    r.set(keys.job_pixels(job_id), b"pixels")
    script_keys = [keys.job(job_id), keys.job_cancel(job_id), keys.job_pixels(job_id)]
    attempt, cancelled, flat, pixels = r.eval(BEGIN_ATTEMPT_LUA, 3, *script_keys)
    assert (attempt, cancelled, pixels) == (1, 0, b"pixels") and b"spec" in flat[::2]
    r.set(keys.job_cancel(job_id), "1")
    assert r.eval(BEGIN_ATTEMPT_LUA, 3, *script_keys)[:2] == [2, 1]
    assert r.eval(BEGIN_ATTEMPT_LUA, 2, *script_keys[:2])[3] is None  # pixels not asked for
    finish(r, keys, job_id, JobStatus.CANCELLED)
    assert r.eval(BEGIN_ATTEMPT_LUA, 3, *script_keys)[0] == 0  # terminal: nothing begun
    assert r.eval(BEGIN_ATTEMPT_LUA, 2, keys.job("gone"), keys.job_cancel("gone")) == []


def append(r: Any, keys: Keys, job_id: str, attempt: int, *spans: tuple[int, int]) -> int:
    args: list[Any] = [EVENTS_MAXLEN, attempt]
    for start, end in spans:
        event = JobEvent(
            type="token", attempt=attempt, text=f"t{start}", token_ids=list(range(start, end)), index=start
        )
        args += [start, end, event.to_fields()["data"]]
    return int(r.eval(APPEND_TOKENS_LUA, 4, *job_keys(keys, job_id), *args))


def test_append_tokens_skips_published_indices_and_refuses_other_attempts(
    redis_client: Any, keys: Keys
) -> None:
    r = redis_client
    job_id = new_job(r, keys, status="generating", attempt=1)
    assert append(r, keys, job_id, 1, (0, 1), (1, 2)) == 1
    assert append(r, keys, job_id, 1, (1, 2), (2, 3)) == 1  # index 1 re-sent: skipped
    assert [e.index for e in events(r, keys, job_id)] == [0, 1, 2]
    assert r.hget(keys.job(job_id), "published") == b"3"
    assert append(r, keys, job_id, 2, (3, 4)) == 0  # fenced: attempt 1 owns the job
    finish(r, keys, job_id, JobStatus.CANCELLED)
    assert append(r, keys, job_id, 1, (3, 4)) == 0  # terminal


def test_terminal_event_shapes() -> None:
    failed = terminal_event(JobStatus.FAILED, ErrorCode.BAD_IMAGE, "corrupt", attempt=3)
    assert (failed.type, failed.finish_reason, failed.attempt) == ("error", "error", 3)
    cancelled = terminal_event(JobStatus.CANCELLED, ErrorCode.CANCELLED)
    assert (cancelled.type, cancelled.finish_reason, cancelled.error) == ("status", "cancelled", None)
    assert json.loads(cancelled.to_fields()["data"])["status"] == "cancelled"


def return_to_decoding(r: Any, keys: Keys, job_id: str, attempt: int) -> int:
    """Return the job (its entry: the one ``pending_entry`` made) to decoding."""
    stream = keys.worker_stream("w")
    entry = r.hget(keys.job(job_id), "entry_id") or b"0-1"
    script_keys = [keys.job(job_id), keys.active_jobs(), keys.decode_queue(), stream]
    args = [time.time(), attempt, "task-" + job_id, "inference", entry]
    return int(r.eval(RETURN_TO_DECODING_LUA, 4, *script_keys, *args))


def pending_entry(r: Any, keys: Keys, job_id: str) -> None:
    """The job's entry in a worker's stream, read (pending) by that worker."""
    stream = keys.worker_stream("w")
    if not r.exists(stream):
        r.xgroup_create(stream, "inference", id="0", mkstream=True)
    entry = r.xadd(stream, {"job_id": job_id})
    r.xreadgroup("inference", "w", {stream: ">"})
    r.hset(keys.job(job_id), mapping={"entry_id": entry, "entry_stream": stream, "decode_skipped": "1"})


def pending(r: Any, keys: Keys) -> int:
    return int(r.xpending(keys.worker_stream("w"), "inference")["pending"])


def test_return_to_decoding_from_waiting_or_generating_by_its_attempt(redis_client: Any, keys: Keys) -> None:
    r = redis_client
    job_id = new_job(r, keys, status="waiting", attempt=2)
    pending_entry(r, keys, job_id)
    assert return_to_decoding(r, keys, job_id, 1) == -1  # an older attempt: the entry is not its own
    assert pending(r, keys) == 1 and r.hget(keys.job(job_id), "status") == b"waiting"
    assert return_to_decoding(r, keys, job_id, 2) == 1
    record = r.hgetall(keys.job(job_id))
    assert record[b"status"] == b"queued" and record[b"attempt"] == b"2" and record[b"returned"] == b"1"
    assert not {b"decode_skipped", b"entry_id", b"entry_stream"} & set(record)
    assert r.lrange(keys.decode_queue(), 0, -1) == [f"task-{job_id}".encode()]
    assert r.zscore(keys.active_jobs(), keys.job(job_id)) is not None  # progress: the sweeper waits
    assert pending(r, keys) == 0 and r.xlen(keys.worker_stream("w")) == 0  # acknowledged and deleted
    assert return_to_decoding(r, keys, job_id, 2) == 0  # queued now: nothing twice

    died = new_job(r, keys, status="generating", attempt=1)  # its worker died mid-answer
    pending_entry(r, keys, died)
    assert return_to_decoding(r, keys, died, 1) == 1 and r.hget(keys.job(died), "status") == b"queued"

    cancelled = new_job(r, keys, status="waiting", attempt=1)
    pending_entry(r, keys, cancelled)
    finish(r, keys, cancelled, JobStatus.CANCELLED)
    assert return_to_decoding(r, keys, cancelled, 1) == 0  # cancelled meanwhile: no task, entry done
    assert r.llen(keys.decode_queue()) == 2 and pending(r, keys) == 0


def test_route_holder_names_the_live_worker_that_holds_every_image(redis_client: Any, keys: Keys) -> None:
    r = redis_client
    session = keys.session_owner("s-1")
    held = [keys.image_input_owner("", "d1"), keys.image_input_owner("", "d2")]

    def holder(follow_up: bool = False, alive_since: float | None = None) -> Any:
        since = time.time() - 5 if alive_since is None else alive_since
        args = [since, keys.worker_heartbeat(""), "1" if follow_up else "0"]
        return r.eval(ROUTE_HOLDER_LUA, 4, keys.workers(), session, *held, *args)

    def beat(worker: str, keeps_images: bool = True, at: float | None = None) -> None:
        r.zadd(keys.workers(), {worker: time.time() if at is None else at})
        stats = {"worker_id": worker, **({"image_inputs": {"entries": 0}} if keeps_images else {})}
        r.set(keys.worker_heartbeat(worker), json.dumps(stats))

    assert holder() is None  # no worker alive
    beat("new")
    beat("other")
    assert holder() is None  # nobody holds the images
    r.mset({held[0]: "other", held[1]: "new"})
    assert holder() is None  # two holders: no one worker holds them all
    r.set(held[1], "other")
    assert holder() == b"other"
    assert holder(alive_since=time.time() + 5) is None  # the holder's heartbeat is stale

    r.set(session, "new")  # a follow-up whose session KV is on another live worker: decoded, sent there
    assert holder(follow_up=True) is None and holder(follow_up=False) == b"other"
    r.set(session, "other")
    assert holder(follow_up=True) == b"other"
    r.set(session, "gone")  # its session's worker is dead: the holder takes it
    assert holder(follow_up=True) == b"other"

    beat("old", keeps_images=False)  # a live worker of a release that keeps no decoded images
    assert holder() is None and holder(follow_up=True) is None
    beat("old", keeps_images=False, at=time.time() - 60)  # gone (stale): no longer counts
    assert holder() == b"other"


def test_del_if_owner_deletes_only_the_callers_record(redis_client: Any, keys: Keys) -> None:
    r = redis_client
    key = keys.image_input_owner("t-1", "d1")
    r.set(key, "w-2")
    assert r.eval(DEL_IF_OWNER_LUA, 1, key, "w-1") == 0 and r.get(key) == b"w-2"
    assert r.eval(DEL_IF_OWNER_LUA, 1, key, "w-2") == 1 and not r.exists(key)
    assert r.eval(DEL_IF_OWNER_LUA, 1, key, "w-2") == 0
