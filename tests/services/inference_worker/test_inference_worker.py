"""The inference worker process against a real Redis: results, streams, cancel, deadlines, crashes."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from services.engine import Engine
from services.inference_worker.__main__ import EXIT_ENGINE_UNHEALTHY
from services.inference_worker.engine_request import build_request
from services.inference_worker.job_store import JobStore
from services.vlm.image_processor import ImageProcessorHandle
from shared import result_cache, workers
from shared.conversations import load_messages
from shared.jobs import new_job_hash
from shared.keys import INFERENCE_GROUP
from shared.schemas import ErrorCode, JobEvent, JobSpec, JobStatus
from tests.support import jobs as J
from tests.support.processes import ManagedProcess
from tests.support.reference import decoded_image
from tests.support.stack import ServiceStack, wait_for

pytestmark = pytest.mark.slow


def submit(stack: ServiceStack, max_tokens: int = 8, seed: int = 0, **kwargs: object) -> JobSpec:
    data = J.image_bytes("JPEG", (320, 240), seed=seed)
    spec = J.make_spec(digest=J.store_image(stack.redis, stack.keys, data), max_tokens=max_tokens, **kwargs)  # type: ignore[arg-type]
    J.create_job(stack.redis, stack.keys, spec)
    if spec.conversation_id:  # the gateway creates the session before the job runs
        fields = {"image_digest": spec.image_digest or "", "messages": "[]"}
        stack.redis.hset(stack.keys.conversation(spec.conversation_id), mapping=fields)
    stack.enqueue_decode(spec.job_id)
    return spec


def finished(stack: ServiceStack, job_id: str, timeout_s: float = 60) -> JobStatus:
    def terminal() -> JobStatus | None:
        status = J.job_status(stack.redis, stack.keys, job_id)
        return status if status and status.terminal else None

    return wait_for(terminal, timeout_s, what=f"job {job_id} terminal")


def tokens(stack: ServiceStack, job_id: str) -> list[JobEvent]:
    return [e for e in J.events(stack.redis, stack.keys, job_id) if e.type == "token"]


def token_count(toks: list[JobEvent]) -> int:
    return sum(len(e.token_ids or []) for e in toks)


def reference_text(stack: ServiceStack, engine: Engine, spec: JobSpec) -> tuple[str, list[int]]:
    """The engine's uncached answer on the pixels the decode path makes from the stored image bytes
    (the job's own pixels are gone once it is terminal)."""
    handle = ImageProcessorHandle.load(stack.env["VLMQ_MODEL"])
    data = stack.redis.get(stack.keys.image(spec.image_digest)) if spec.image_digest else None
    image = decoded_image(handle, data, spec.image_digest) if data is not None else None
    events = engine.generate_sync(
        build_request(spec.model_copy(update={"use_cache": False}), f"ref-{spec.job_id}", image), timeout_s=60
    )
    return "".join(e.text for e in events), [t for e in events for t in e.token_ids]


def assert_stream_is_whole(stack: ServiceStack, job_id: str) -> list[JobEvent]:
    """Token events from the first entry: every index once, in order, text = the final text. An
    event may carry several tokens (the steps of one write): each starts where the one before ended."""
    toks = tokens(stack, job_id)
    ends = [0]
    for e in toks:
        ends.append(ends[-1] + len(e.token_ids or []))
    assert [e.index for e in toks] == ends[:-1] and all(e.token_ids for e in toks)
    record = J.job(stack.redis, stack.keys, job_id)
    assert "".join(e.text or "" for e in toks) == record.text
    return toks


def test_job_done_equals_engine_generate_sync(
    inference_stack: ServiceStack, reference_engine: Engine
) -> None:
    spec = submit(inference_stack, max_tokens=16, conversation_id="s-" + J.uuid.uuid4().hex[:8])
    assert finished(inference_stack, spec.job_id) is JobStatus.DONE
    record = J.job(inference_stack.redis, inference_stack.keys, spec.job_id)
    text, ids = reference_text(inference_stack, reference_engine, spec)
    assert record.text == text and record.finish_reason == "length"
    toks = assert_stream_is_whole(inference_stack, spec.job_id)
    assert [t for e in toks for t in e.token_ids or []] == ids
    assert record.usage and record.usage.completion_tokens == 16
    assert record.timings and record.timings.total > 0 and record.timings.ttft > 0
    events = J.events(inference_stack.redis, inference_stack.keys, spec.job_id)
    assert [e.status for e in events if e.type == "status"][:4] == [
        "queued",
        "decoding",
        "waiting",
        "generating",
    ]
    assert events[-1].type == "done" and events[-1].final_text == text
    log = (inference_stack.log_dir / "inference.log").read_text()
    assert "pictures are finished on the engine's device" in log  # the reference: the processor's steps
    # session turn and result cache written on done; stream entry acknowledged and removed
    assert spec.conversation_id is not None
    session = inference_stack.redis.hgetall(inference_stack.keys.conversation(spec.conversation_id))
    turns = load_messages(session[b"messages"])
    assert [t.role for t in turns] == ["user", "assistant"] and turns[-1].text == text
    key = result_cache.cache_key(inference_stack.keys, inference_stack.settings.result_model_id, spec)
    cached = result_cache.decode(inference_stack.redis.get(key))
    assert cached and cached.text == text
    assert (
        inference_stack.redis.xpending(inference_stack.keys.inference_stream(), INFERENCE_GROUP)["pending"]
        == 0
    )


def test_cancel_flag_stops_a_running_job(inference_stack: ServiceStack) -> None:
    spec = submit(inference_stack, max_tokens=500, seed=3)
    wait_for(lambda: len(tokens(inference_stack, spec.job_id)) >= 3, 60, interval_s=0.01, what="tokens")
    inference_stack.redis.set(inference_stack.keys.job_cancel(spec.job_id), 1)
    started = time.monotonic()
    assert finished(inference_stack, spec.job_id, 10) is JobStatus.CANCELLED
    assert time.monotonic() - started < 2.0
    record = J.job(inference_stack.redis, inference_stack.keys, spec.job_id)
    assert record.usage is not None and record.usage.completion_tokens < 500
    wait_for(lambda: _heartbeat(inference_stack)["inflight"] == 0, 5, what="slot freed")
    follow_up = submit(inference_stack, max_tokens=4, seed=4)
    assert finished(inference_stack, follow_up.job_id) is JobStatus.DONE


def test_expired_job_is_never_run(inference_stack: ServiceStack) -> None:
    """A job whose deadline passes while it waits in the inference stream."""
    spec = J.make_spec(deadline=time.time() - 0.1, max_tokens=4)
    fields = {**new_job_hash(spec), "status": "waiting"}
    inference_stack.redis.hset(inference_stack.keys.job(spec.job_id), mapping=fields)
    inference_stack.redis.xadd(inference_stack.keys.inference_stream(), {"job_id": spec.job_id})
    assert finished(inference_stack, spec.job_id) is JobStatus.EXPIRED
    assert tokens(inference_stack, spec.job_id) == []
    assert "generating" not in [
        e.status for e in J.events(inference_stack.redis, inference_stack.keys, spec.job_id)
    ]


def deliver_to_a_dead_worker(stack: ServiceStack, job_id: str) -> None:
    """The job's entry, read by a consumer that then died: add and deliver atomically, so no live
    worker gets it first (it is claimed once idle)."""
    keys, pipe = stack.keys, stack.redis.pipeline(transaction=True)
    pipe.xadd(keys.inference_stream(), {"job_id": job_id})
    pipe.xreadgroup(INFERENCE_GROUP, "ghost-worker", {keys.inference_stream(): ">"}, count=1000)
    pipe.execute()


def test_poison_job_is_dead_lettered(inference_stack: ServiceStack) -> None:
    """An entry a dead consumer took, after max_deliveries attempts already died on it."""
    r, keys = inference_stack.redis, inference_stack.keys
    spec = J.make_spec(max_tokens=4)
    r.hset(
        keys.job(spec.job_id),
        mapping={
            **new_job_hash(spec),
            "status": "generating",
            "attempt": inference_stack.env["VLMQ_MAX_DELIVERIES"],
        },
    )
    deliver_to_a_dead_worker(inference_stack, spec.job_id)
    assert finished(inference_stack, spec.job_id, 30) is JobStatus.FAILED
    record = J.job(r, keys, spec.job_id)
    assert record.error and "dead letter" in record.error
    dead = [f for _i, f in r.xrange(keys.dead_letters()) if f[b"job_id"].decode() == spec.job_id]
    assert len(dead) == 1 and tokens(inference_stack, spec.job_id) == []
    wait_for(lambda: r.xpending(keys.inference_stream(), INFERENCE_GROUP)["pending"] == 0, 5, what="acked")


def test_a_turn_without_pixels_claimed_from_a_dead_worker_goes_back_to_decoding(
    inference_stack: ServiceStack, reference_engine: Engine
) -> None:
    """A turn the gateway handed over without pixels, mid-answer on a worker that died: the worker
    that claims it does not hold its images, so it returns the job to decoding (once: not a
    delivery that counts), and the decode worker hands it back with pixels."""
    r, keys = inference_stack.redis, inference_stack.keys
    data = J.image_bytes("PNG", (150, 210), seed=77)  # a picture this worker has never decoded
    spec = J.make_spec(digest=J.store_image(r, keys, data), max_tokens=12)
    J.create_job(r, keys, spec)
    r.hset(keys.job(spec.job_id), mapping={"status": "generating", "attempt": 1, "decode_skipped": "1"})
    deliver_to_a_dead_worker(inference_stack, spec.job_id)
    assert finished(inference_stack, spec.job_id, 60) is JobStatus.DONE
    record = J.job(r, keys, spec.job_id)
    fields = {k.decode(): v.decode() for k, v in r.hgetall(keys.job(spec.job_id)).items()}
    assert fields["returned"] == "1" and "decode_skipped" not in fields and "decode_started_at" in fields
    assert record.attempt == 3  # the claim that returned it, then the one with pixels
    assert record.text == reference_text(inference_stack, reference_engine, spec)[0]
    assert_stream_is_whole(inference_stack, spec.job_id)
    wait_for(lambda: r.xpending(keys.inference_stream(), INFERENCE_GROUP)["pending"] == 0, 5, what="acked")


def test_killed_worker_job_is_claimed_and_finished_once(
    inference_stack: ServiceStack, reference_engine: Engine
) -> None:
    spec = submit(inference_stack, max_tokens=400, seed=5)
    wait_for(lambda: len(tokens(inference_stack, spec.job_id)) >= 5, 60, interval_s=0.005, what="tokens")
    inference_stack.kill("inference", signal.SIGKILL)
    published = len(tokens(inference_stack, spec.job_id))
    assert J.job_status(inference_stack.redis, inference_stack.keys, spec.job_id) is JobStatus.GENERATING
    inference_stack.restart("inference")
    assert finished(inference_stack, spec.job_id, 90) is JobStatus.DONE
    record = J.job(inference_stack.redis, inference_stack.keys, spec.job_id)
    assert record.attempt == 2
    toks = assert_stream_is_whole(inference_stack, spec.job_id)  # no gap, no duplicate across attempts
    assert {e.attempt for e in toks[:published]} == {1} and {e.attempt for e in toks[published:]} <= {2}
    assert token_count(toks) == 400
    assert record.text == reference_text(inference_stack, reference_engine, spec)[0]
    events = J.events(inference_stack.redis, inference_stack.keys, spec.job_id)
    assert sum(e.type == "done" for e in events) == 1


def test_sigterm_finishes_in_flight_jobs_then_exits(inference_stack: ServiceStack) -> None:
    spec = submit(inference_stack, max_tokens=300, seed=6)
    wait_for(lambda: len(tokens(inference_stack, spec.job_id)) >= 2, 60, interval_s=0.005, what="tokens")
    proc = inference_stack.procs["inference"]
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert J.job_status(inference_stack.redis, inference_stack.keys, spec.job_id) is JobStatus.DONE
    assert not inference_stack.worker_alive()  # heartbeat removed on exit
    inference_stack.restart("inference")


def _heartbeat(stack: ServiceStack) -> dict:
    (beat,) = workers.live_sync(stack.redis, stack.keys, 60.0, time.time())
    return beat


def test_malformed_job_fails_without_crashing_the_worker(inference_stack: ServiceStack) -> None:
    r, keys = inference_stack.redis, inference_stack.keys
    job_id = J.uuid.uuid4().hex
    now = str(time.time())
    r.hset(keys.job(job_id), mapping={"spec": '{"job_id": 1}', "status": "waiting", "created_at": now})
    r.xadd(keys.inference_stream(), {"job_id": job_id})
    pid = inference_stack.procs["inference"].pid
    wait_for(lambda: r.hget(keys.job(job_id), "status") == b"failed", 10, what="malformed job failed")
    assert b"internal error" in r.hget(keys.job(job_id), "error")
    follow_up = submit(inference_stack, max_tokens=2, seed=8)
    assert finished(inference_stack, follow_up.job_id) is JobStatus.DONE
    assert inference_stack.procs["inference"].pid == pid and inference_stack.procs["inference"].alive()


def test_a_prompt_the_engine_refuses_fails_its_job_as_the_requests_fault(
    inference_stack: ServiceStack,
) -> None:
    """The engine thread renders prompts: one past the context ends its job `invalid_request` (not
    internal), and the worker goes on serving."""
    r, keys = inference_stack.redis, inference_stack.keys
    spec = J.make_spec(prompt="x" * 12000, max_tokens=4)
    r.hset(keys.job(spec.job_id), mapping={**new_job_hash(spec), "status": "waiting"})
    r.xadd(keys.inference_stream(), {"job_id": spec.job_id})
    assert finished(inference_stack, spec.job_id) is JobStatus.FAILED
    record = J.job(r, keys, spec.job_id)
    assert record.error_code == ErrorCode.INVALID_REQUEST and "exceeds the context" in (record.error or "")
    assert tokens(inference_stack, spec.job_id) == []
    statuses = [e.status for e in J.events(r, keys, spec.job_id) if e.status]
    assert "generating" not in statuses and statuses[-1] is JobStatus.FAILED  # it never ran
    follow_up = submit(inference_stack, max_tokens=2, seed=9)
    assert finished(inference_stack, follow_up.job_id) is JobStatus.DONE
    wait_for(lambda: r.xpending(keys.inference_stream(), INFERENCE_GROUP)["pending"] == 0, 5, what="acked")


def test_retry_that_diverges_from_streamed_tokens_fails_instead_of_mixing(
    inference_stack: ServiceStack,
) -> None:
    """An earlier attempt streamed a token this attempt does not reproduce: fail, never mix attempts."""
    r, keys = inference_stack.redis, inference_stack.keys
    data = J.image_bytes("JPEG", (320, 240), seed=21)
    spec = J.make_spec(digest=J.store_image(r, keys, data), max_tokens=20)
    J.create_job(r, keys, spec)
    r.hset(keys.job(spec.job_id), "attempt", 1)  # attempt 1 died after streaming one token
    r.xadd(
        keys.job_events(spec.job_id),
        JobEvent(type="token", attempt=1, text="?", token_ids=[639], index=0).to_fields(),
    )
    inference_stack.enqueue_decode(spec.job_id)
    assert finished(inference_stack, spec.job_id) is JobStatus.FAILED
    record = J.job(r, keys, spec.job_id)
    assert record.attempt == 2 and "diverged" in (record.error or "")
    assert [e.attempt for e in tokens(inference_stack, spec.job_id)] == [1]  # nothing of attempt 2 published


def test_second_sigterm_releases_in_flight_jobs_to_another_worker(inference_stack: ServiceStack) -> None:
    """Stop now (drain cut short): the job goes back to waiting, a new worker claims and finishes it."""
    spec = submit(inference_stack, max_tokens=500, seed=9)
    wait_for(lambda: len(tokens(inference_stack, spec.job_id)) >= 3, 60, interval_s=0.005, what="tokens")
    proc = inference_stack.procs["inference"]
    proc.signal(signal.SIGTERM)
    time.sleep(0.05)
    proc.signal(signal.SIGTERM)
    assert proc.wait(15) == 0  # ~500 random-model tokens take far longer than the 50 ms between signals
    assert J.job_status(inference_stack.redis, inference_stack.keys, spec.job_id) is JobStatus.WAITING
    inference_stack.restart("inference")
    assert finished(inference_stack, spec.job_id, 60) is JobStatus.DONE
    assert J.job(inference_stack.redis, inference_stack.keys, spec.job_id).attempt == 2
    assert token_count(assert_stream_is_whole(inference_stack, spec.job_id)) == 500


def test_job_finished_elsewhere_stops_generating_and_gets_no_more_tokens(
    inference_stack: ServiceStack,
) -> None:
    """The gateway wrote `cancelled` itself (no flag): the next token append is refused and the run stops."""
    r, keys = inference_stack.redis, inference_stack.keys
    spec = submit(inference_stack, max_tokens=500, seed=10)
    wait_for(lambda: len(tokens(inference_stack, spec.job_id)) >= 3, 60, interval_s=0.005, what="tokens")
    JobStore(r, keys, 3600, 900).end(spec.job_id, JobStatus.CANCELLED, ErrorCode.CANCELLED, None, 1)
    wait_for(lambda: _heartbeat(inference_stack)["inflight"] == 0, 5, what="run stopped")
    events = J.events(r, keys, spec.job_id)
    last = max(i for i, e in enumerate(events) if e.status is JobStatus.CANCELLED)
    assert last == len(events) - 1  # nothing appended after the terminal event
    assert token_count(tokens(inference_stack, spec.job_id)) < 500


def test_heartbeat_lives_exactly_as_long_as_the_gateway_trusts_it(inference_stack: ServiceStack) -> None:
    (worker_id,) = inference_stack.redis.zrange(inference_stack.keys.workers(), 0, -1)
    key = inference_stack.keys.worker_heartbeat(worker_id.decode())
    stale_ms = 1000 * float(inference_stack.env["VLMQ_WORKER_STALE_S"])
    assert stale_ms - 1500 < inference_stack.redis.pttl(key) <= stale_ms  # TTL = worker_stale_s


def test_entries_are_renewed_while_draining(inference_stack: ServiceStack) -> None:
    """SIGTERM with long jobs: their entries keep being renewed every heartbeat (0.5 s here), so they
    never go idle long enough for another worker to claim them while this one drains. Eight
    500-token jobs share the batch, so they are still running a second after SIGTERM."""
    r, keys = inference_stack.redis, inference_stack.keys
    specs = [submit(inference_stack, max_tokens=500, seed=12 + i) for i in range(8)]
    wait_for(lambda: all(len(tokens(inference_stack, s.job_id)) >= 3 for s in specs), 60, what="tokens")
    proc = inference_stack.procs["inference"]
    proc.signal(signal.SIGTERM)
    time.sleep(1.0)  # without renewal the entries would now be idle >= 1 s
    pending = r.xpending_range(keys.inference_stream(), INFERENCE_GROUP, "-", "+", 10)
    try:
        assert pending and all(p["time_since_delivered"] < 800 for p in pending)
        assert proc.wait(30) == 0
        assert all(J.job_status(r, keys, s.job_id) is JobStatus.DONE for s in specs)
    finally:
        inference_stack.restart("inference")


def test_unhealthy_engine_exits_with_its_code_and_its_jobs_finish_on_the_next_worker(
    inference_stack: ServiceStack, reference_engine: Engine, tmp_path: Path
) -> None:
    """The worker's model starts failing (faulty_worker.py: a forward hook, test code only) with
    VLMQ_MAX_FAILED_STEPS=1: the running job fails with the error, the engine turns unhealthy, the
    worker releases the job queued behind it (batch of 1) without waiting for the 20 s drain and
    exits 75; the next worker claims the released job and finishes it."""
    stack, fault = inference_stack, tmp_path / "fault"
    real = stack.procs["inference"]
    real.stop()
    env = {"VLMQ_MAX_BATCH": "1", "VLMQ_MAX_FAILED_STEPS": "1", "FAULTY_WORKER_FILE": str(fault)}
    cmd = [sys.executable, "-m", "tests.services.inference_worker.faulty_worker"]
    ready = lambda _p: stack.worker_alive()  # noqa: E731
    faulty = ManagedProcess("inference", cmd, {**real.env, **env}, real.log_path, ready)
    stack.procs["inference"] = faulty
    try:
        stack.restart("inference")
        running, queued = submit(stack, max_tokens=500, seed=31), submit(stack, max_tokens=6, seed=32)
        wait_for(lambda: len(tokens(stack, running.job_id)) >= 3, 60, interval_s=0.01, what="tokens")
        wait_for(lambda: _heartbeat(stack)["inflight"] == 2, 30, what="queued job in the engine")
        fault.touch()
        assert faulty.wait(15) == EXIT_ENGINE_UNHEALTHY
        assert "engine unhealthy" in faulty.log() and not stack.worker_alive()
        assert J.job_status(stack.redis, stack.keys, queued.job_id) is JobStatus.WAITING
    finally:
        stack.procs["inference"] = real
        stack.restart("inference")
    assert finished(stack, queued.job_id, 60) is JobStatus.DONE
    record = J.job(stack.redis, stack.keys, queued.job_id)
    assert record.attempt == 2 and record.text == reference_text(stack, reference_engine, queued)[0]
    outcome = finished(stack, running.job_id, 90)
    ran = J.job(stack.redis, stack.keys, running.job_id)
    if outcome is JobStatus.FAILED:  # its failure was written before the exit (the usual case)
        assert "injected forward fault" in (ran.error or "") and ran.attempt == 1
    else:  # the worker exited before writing it: released with the rest, finished by the next worker
        assert outcome is JobStatus.DONE and ran.attempt == 2
