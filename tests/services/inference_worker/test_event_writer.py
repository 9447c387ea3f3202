"""The event writer against a real Redis, fed engine events by hand (no engine, no model).

Faults are real Redis replies: a connection that drops after EXEC ran (the reply is lost), a
newer attempt owning the job, a script error. The only stand-in is a redis-py client whose
pipeline raises ConnectionError after its first successful EXEC (a lost reply).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from services.engine.api import FinishReason, TokenEvent, Usage
from services.inference_worker.after_finish import WriterConfig
from services.inference_worker.event_writer import EventWriter
from services.inference_worker.job_run import JobRun
from services.inference_worker.job_store import JobStore
from services.inference_worker.stream_consumer import StreamConsumer
from shared import metrics_hash
from shared.conversations import load_messages
from shared.keys import INFERENCE_GROUP, Keys
from shared.schemas import JobStatus
from tests.support import jobs as J


class LostReplyPipeline(redis.client.Pipeline):  # type: ignore[type-arg]
    lose_next = False

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        result = super().execute(raise_on_error)
        if LostReplyPipeline.lose_next and result:
            LostReplyPipeline.lose_next = False
            raise redis.ConnectionError("connection lost after EXEC (test)")
        return result


class LostReplyRedis(redis.Redis):
    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        return LostReplyPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)


class Harness:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.r: Any = client
        self.keys = keys
        self.store = JobStore(client, keys, 3600, 900)
        self.consumer = StreamConsumer(client, keys, "w1")
        self.consumer.ensure_groups()
        self.cancelled: list[str] = []
        self.finished: list[str] = []
        config = WriterConfig("model-x", 600, 600)
        self.writer = EventWriter(
            client,
            self.store,
            self.consumer,
            config,
            lambda run: self.finished.append(run.job_id),
            self.cancelled.append,
        )

    def start_job(self, session: bool = True, attempt: int = 1) -> JobRun:
        spec = J.make_spec(
            "Colour?", max_tokens=3, conversation_id="s-" + J.uuid.uuid4().hex[:6] if session else None
        )
        J.create_job(self.r, self.keys, spec)
        if session:
            key = self.keys.conversation(str(spec.conversation_id))
            self.r.hset(key, mapping={"messages": "[]", "image_digest": ""})
        self.r.hset(self.keys.job(spec.job_id), mapping={"status": "waiting", "attempt": attempt})
        self.r.xadd(self.keys.inference_stream(), {"job_id": spec.job_id})
        (entry,) = self.consumer.read(1, 10)
        return JobRun(
            entry=entry, spec=spec, attempt=attempt, request_id=f"{spec.job_id}:{attempt}", published=[]
        )


def events_of(run: JobRun, pieces: list[str]) -> list[TokenEvent]:
    out = [TokenEvent(run.request_id, (100 + i,), p, i) for i, p in enumerate(pieces)]
    last = TokenEvent(run.request_id, (), "", len(pieces), FinishReason.STOP, usage=Usage(10, len(pieces), 0))
    return [*out, last]


@pytest.fixture
def harness(redis_url: str, keys: Keys) -> Harness:
    return Harness(LostReplyRedis.from_url(redis_url), keys)


def test_write_retried_after_a_lost_reply_publishes_everything_once(harness: Harness) -> None:
    run = harness.start_job()
    LostReplyPipeline.lose_next = True  # the MULTI/EXEC runs, then its reply is lost
    harness.writer.write([(run, e) for e in events_of(run, ["Re", "d", "."])])
    events = J.events(harness.r, harness.keys, run.job_id)
    tokens = [(e.index, e.token_ids, e.text) for e in events if e.type == "token"]
    assert tokens == [(0, [100, 101, 102], "Red.")]  # the steps of one write: one stream entry
    assert sum(e.type == "done" for e in events) == 1 and "generating" in [e.status for e in events]
    record = J.job(harness.r, harness.keys, run.job_id)
    assert record.status is JobStatus.DONE and record.text == "Red." and run.text == "Red."
    assert run.token_ids == [100, 101, 102]
    # the side effects of the attempt that wrote FINISH still ran, once
    key = harness.keys.conversation(str(run.spec.conversation_id))
    turns = load_messages(harness.r.hget(key, "messages"))
    assert [(t.role, t.text) for t in turns] == [("user", "Colour?"), ("assistant", "Red.")]
    done = metrics_hash.series("jobs_total", outcome="done")
    assert int(harness.r.hget(harness.keys.metrics_counters(), done)) == 1
    assert harness.r.xpending(harness.keys.inference_stream(), INFERENCE_GROUP)["pending"] == 0
    assert harness.finished == [run.job_id]


def test_re_sent_events_are_idempotent(harness: Harness) -> None:
    run = harness.start_job(session=False)
    first = events_of(run, ["A", "B"])
    harness.writer.write([(run, first[0]), (run, first[1])])
    harness.writer.write([(run, first[1]), (run, first[2])])  # index 1 again (engine re-send)
    tokens = [
        (e.index, e.token_ids) for e in J.events(harness.r, harness.keys, run.job_id) if e.type == "token"
    ]
    assert tokens == [(0, [100, 101])]
    assert J.job(harness.r, harness.keys, run.job_id).text == "AB"


def test_a_stale_attempt_cannot_write_nor_ack(harness: Harness) -> None:
    run = harness.start_job(session=False)
    harness.r.hset(harness.keys.job(run.job_id), "attempt", 2)  # another worker claimed it meanwhile
    harness.writer.write([(run, e) for e in events_of(run, ["x", "y"])])
    events = J.events(harness.r, harness.keys, run.job_id)
    assert [e for e in events if e.type in ("token", "done")] == []
    assert J.job_status(harness.r, harness.keys, run.job_id) is JobStatus.WAITING
    assert harness.cancelled == [run.request_id]  # the engine stops generating for nobody
    assert harness.r.xpending(harness.keys.inference_stream(), INFERENCE_GROUP)["pending"] == 1  # not ours


def test_a_permanent_redis_error_fails_the_job_and_marks_the_writer_unhealthy(harness: Harness) -> None:
    run = harness.start_job(session=False)
    harness.r.hset(harness.keys.job(run.job_id), "published", "garbage")  # the append script errors
    started = time.monotonic()
    harness.writer.write([(run, e) for e in events_of(run, ["x", "y"])[:2]])  # mid-generation
    assert time.monotonic() - started < 2.0  # not retried forever
    assert harness.writer.error and "event writer" in harness.writer.error
    record = J.job(harness.r, harness.keys, run.job_id)
    assert record.status is JobStatus.FAILED and record.error_code == "internal"
    assert harness.cancelled == [run.request_id] and harness.finished == [run.job_id]
    assert harness.r.xpending(harness.keys.inference_stream(), INFERENCE_GROUP)["pending"] == 0


def test_renew_never_takes_back_an_entry_another_worker_claimed(redis_client: Any, keys: Keys) -> None:
    mine = StreamConsumer(redis_client, keys, "old")
    other = StreamConsumer(redis_client, keys, "new")
    mine.ensure_groups()
    for job in ("a", "b"):
        redis_client.xadd(keys.inference_stream(), {"job_id": job})
    a, b = mine.read(2, 10)
    time.sleep(0.2)
    assert [e.job_id for e in other.claim_idle(100, 1, [keys.inference_stream()])] == [
        "a"
    ]  # "old" looked dead
    assert mine.renew([a, b]) == {a.entry_id}  # lost "a", kept "b"
    pending = redis_client.xpending_range(keys.inference_stream(), INFERENCE_GROUP, "-", "+", 10)
    owners = {p["message_id"].decode(): p["consumer"].decode() for p in pending}
    assert owners == {a.entry_id: "new", b.entry_id: "old"}


def test_inter_token_latency_is_observed_once_per_job(harness: Harness) -> None:
    run = harness.start_job(session=False)
    events = events_of(run, ["a", "b", "c"])
    for event in events[:3]:  # one engine step per flush, as in production
        harness.writer.write([(run, event)])
        time.sleep(0.01)
    harness.writer.write([(run, events[3])])
    harness.writer.effects.metrics.period_s = 0.0  # histograms are written once a period: now
    harness.writer.effects.flush_metrics()
    count = harness.r.hget(harness.keys.metrics_counters(), "inter_token_latency_seconds_count")
    assert int(count) == 2  # gaps between 3 token writes, whoever listens to the stream


def test_a_write_of_several_tokens_counts_each_token_at_the_pace_between_writes(harness: Harness) -> None:
    """Tokens the stream interval held go out together; the histogram still sees one observation a
    token, each the gap between the writes shared by the later write's tokens."""
    run = harness.start_job(session=False)
    events = events_of(run, ["a", "b", "c", "d"])
    harness.writer.write([(run, events[0])])
    time.sleep(0.06)
    harness.writer.write([(run, e) for e in events[1:]])  # three tokens and the end in one write
    harness.writer.effects.metrics.period_s = 0.0
    harness.writer.effects.flush_metrics()
    counters = harness.r.hgetall(harness.keys.metrics_counters())
    count = int(counters[b"inter_token_latency_seconds_count"])
    total = float(counters[b"inter_token_latency_seconds_sum"])
    assert count == 3 and 0.06 <= total < 0.5  # three tokens sharing one ~60 ms gap, not one gap of 60 ms


def test_the_turn_is_recorded_with_the_finish_itself(harness: Harness) -> None:
    """A client that sees ``done`` and asks its next question at once must find this turn stored
    (its next turn is built on the stored conversation): the turn goes in FINISH's own MULTI,
    not in the after-finish round trip (here never run)."""
    run = harness.start_job()
    harness.writer.flush([(run, e) for e in events_of(run, ["Bl", "ue"])])  # no after_finish
    assert J.job(harness.r, harness.keys, run.job_id).status is JobStatus.DONE
    key = harness.keys.conversation(str(run.spec.conversation_id))
    turns = load_messages(harness.r.hget(key, "messages"))
    assert [(t.role, t.text) for t in turns] == [("user", "Colour?"), ("assistant", "Blue")]


def test_a_fenced_attempt_records_no_turn(harness: Harness) -> None:
    run = harness.start_job(attempt=1)
    harness.r.hset(harness.keys.job(run.job_id), "attempt", 2)  # a newer attempt owns the job
    harness.writer.flush([(run, e) for e in events_of(run, ["Re", "d"])])
    key = harness.keys.conversation(str(run.spec.conversation_id))
    assert load_messages(harness.r.hget(key, "messages")) == []


def test_one_write_per_engine_step_for_every_sequence(harness: Harness) -> None:
    """The engine's events of one step, for all its sequences, go out in one MULTI/EXEC: the writer
    waits for the step's mark (``step_done``) before writing."""
    runs = [harness.start_job(session=False) for _ in range(4)]
    harness.writer.start()
    try:
        for step, text in enumerate(["R", "e", "d"]):
            for run in runs:  # the engine emits each sequence's token, then marks the step's end
                harness.writer.put(run, TokenEvent(run.request_id, (100 + step,), text, step))
                time.sleep(0.001)  # events trickle in as the engine samples row by row
            harness.writer.step_done()
            wait = time.monotonic() + 5
            while harness.writer.events < 4 * (step + 1) and time.monotonic() < wait:
                time.sleep(0.005)
    finally:
        harness.writer.stop()
    assert harness.writer.events == 12 and harness.writer.flushes == 3
    for run in runs:
        tokens = [e for e in J.events(harness.r, harness.keys, run.job_id) if e.type == "token"]
        assert [e.index for e in tokens] == [0, 1, 2]


def test_a_retry_publishes_only_the_tokens_after_the_earlier_attempts_in_one_entry(harness: Harness) -> None:
    run = harness.start_job(session=False, attempt=2)
    run.published = [100, 101]  # attempt 1 streamed two tokens before its worker died
    harness.r.hset(harness.keys.job(run.job_id), "published", 2)
    harness.writer.write([(run, e) for e in events_of(run, ["A", "B", "C", "D"])])
    tokens = [
        (e.index, e.token_ids, e.text)
        for e in J.events(harness.r, harness.keys, run.job_id)
        if e.type == "token"
    ]
    assert tokens == [(2, [102, 103], "CD")]
    assert J.job(harness.r, harness.keys, run.job_id).text == "ABCD"


def test_middle_tokens_wait_for_the_stream_interval_but_the_first_token_and_the_end_do_not(
    redis_url: str, keys: Keys
) -> None:
    """With ``stream_interval_s`` set, steps that hold only middle tokens are written with the next
    urgent one (here the end: the interval is far longer than the test): one entry for them all."""
    harness = Harness(LostReplyRedis.from_url(redis_url), keys)
    harness.writer.stream_interval_s = 30.0
    run = harness.start_job(session=False)
    events = events_of(run, ["R", "e", "d"])

    def stream() -> list[tuple[int | None, list[int] | None]]:
        return [(e.index, e.token_ids) for e in J.events(harness.r, keys, run.job_id) if e.type == "token"]

    def wait_for_flushes(n: int) -> None:
        deadline = time.monotonic() + 5
        while harness.writer.flushes < n and time.monotonic() < deadline:
            time.sleep(0.005)

    harness.writer.start()
    try:
        harness.writer.put(run, events[0])  # the first token: written at once
        harness.writer.step_done()
        wait_for_flushes(1)
        assert stream() == [(0, [100])] and run.generating
        for event in events[1:3]:  # two steps of middle tokens: held
            harness.writer.put(run, event)
            harness.writer.step_done()
        time.sleep(0.3)
        assert harness.writer.flushes == 1 and stream() == [(0, [100])]
        harness.writer.put(run, events[3])  # the end: written at once, with the held tokens
        harness.writer.step_done()
        wait_for_flushes(2)
    finally:
        harness.writer.stop()
    assert harness.writer.flushes == 2 and stream() == [(0, [100]), (1, [101, 102])]
    assert J.job(harness.r, keys, run.job_id).status is JobStatus.DONE
