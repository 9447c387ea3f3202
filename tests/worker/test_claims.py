"""``worker.claims`` against a real Redis: real task messages (``DecodeTasks``, and Celery's own
``send_task`` for a countdown retry), the claim script moving them."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from shared.config import CommonSettings
from shared.decode_task import BATCH_QUEUE, DECODE_QUEUE, DECODE_TASK, QUEUES, DecodeTasks, make_celery_app
from shared.keys import Keys
from worker.claims import DecodeClaims, job_of


@pytest.fixture
def tasks(redis_url: str, keys: Keys) -> Iterator[DecodeTasks]:
    settings = CommonSettings(_env_file=None, redis_url=redis_url, key_prefix=keys.prefix)  # type: ignore[call-arg]
    made = DecodeTasks(settings)
    yield made
    made.close()


def enqueue(client: redis.Redis, tasks: DecodeTasks, *job_ids: str, priority: str = "interactive") -> None:
    pipe = client.pipeline()
    for job_id in job_ids:
        tasks.push(pipe, job_id, priority)
    pipe.execute()


def claims_of(client: redis.Redis, keys: Keys) -> DecodeClaims:
    return DecodeClaims(client, keys, DECODE_TASK, ttl_s=60, queues=QUEUES)


def test_claims_take_the_oldest_waiting_job_one_at_a_time(
    redis_client: redis.Redis, keys: Keys, tasks: DecodeTasks
) -> None:
    enqueue(redis_client, tasks, "job-1", "job-2")
    claims, task = claims_of(redis_client, keys), "task-a"
    first = claims.first(task, DECODE_QUEUE)
    assert (first.outcome, first.job_id) == ("claimed", "job-1")
    assert job_of(redis_client.get(keys.decode_claim(task)) or b"") == "job-1"  # kept till it is done
    assert redis_client.llen(keys.decode_queue()) == 1
    second = claims.next(task, DECODE_QUEUE, first)
    assert (second.outcome, second.job_id) == ("claimed", "job-2")
    assert job_of(redis_client.get(keys.decode_claim(task)) or b"") == "job-2"
    assert claims.next(task, DECODE_QUEUE, second).outcome == "none"
    assert not redis_client.exists(keys.decode_claim(task), keys.decode_queue())
    counted = redis_client.hget(keys.metrics_counters(), "decode_claimed_jobs_total")
    assert int(counted or 0) == 2


def test_a_claim_call_run_again_after_a_lost_reply_answers_the_claim_it_made(
    redis_client: redis.Redis, keys: Keys, tasks: DecodeTasks
) -> None:
    """redis-py re-sends a command once after a connection error: the re-run must neither end the
    claim it just made (its job would be lost) nor take another."""
    enqueue(redis_client, tasks, "job-1", "job-2", "job-3")
    claims = claims_of(redis_client, keys)
    first = claims.first("t", DECODE_QUEUE)
    second = claims.next("t", DECODE_QUEUE, first)
    again = claims.next("t", DECODE_QUEUE, first)  # the same call, re-sent
    assert (again.outcome, again.job_id) == ("claimed", second.job_id) == ("claimed", "job-2")
    assert redis_client.llen(keys.decode_queue()) == 1  # job-3 still waits
    claims.release("t", DECODE_QUEUE, second)
    claims.release("t", DECODE_QUEUE, second)  # re-sent: nothing left to end
    assert not redis_client.exists(keys.decode_claim("t"))


def test_a_task_gives_back_its_claim_unfinished(
    redis_client: redis.Redis, keys: Keys, tasks: DecodeTasks
) -> None:
    """A claimed job met a Redis error, or the task ran past its claim budget: the kept message goes
    back to the queue's consuming end, and nothing is taken."""
    enqueue(redis_client, tasks, "job-1", "job-2")
    claims = claims_of(redis_client, keys)
    claims.first("t", DECODE_QUEUE)
    assert claims.give_back("t", DECODE_QUEUE).outcome == "returned"
    assert claims.give_back("t", DECODE_QUEUE).outcome == "none"
    oldest_first = [job_of(m) for m in reversed(redis_client.lrange(keys.decode_queue(), 0, -1))]
    assert oldest_first == ["job-1", "job-2"] and not redis_client.exists(keys.decode_claim("t"))


def test_a_task_claims_from_its_own_queue_only(
    redis_client: redis.Redis, keys: Keys, tasks: DecodeTasks
) -> None:
    """A worker that serves the batch queue alone (niced) never takes interactive jobs, and a batch
    task claims only while no interactive job waits (batch work never delays interactive work)."""
    enqueue(redis_client, tasks, "batch-1", "batch-2", priority="batch")
    enqueue(redis_client, tasks, "interactive-1")
    claims = claims_of(redis_client, keys)
    assert claims.first("b", BATCH_QUEUE).outcome == "none"  # interactive work waits
    interactive = claims.first("i", DECODE_QUEUE)
    assert interactive.job_id == "interactive-1"
    assert claims.next("i", DECODE_QUEUE, interactive).outcome == "none"  # no batch job for "i"
    batch = claims.first("b", BATCH_QUEUE)
    assert batch.job_id == "batch-1"
    claims.release("b", BATCH_QUEUE, batch)
    assert redis_client.llen(keys.decode_queue(BATCH_QUEUE)) == 1
    assert not redis_client.exists(keys.decode_claim("i"), keys.decode_claim("b"))


def test_a_redelivered_task_puts_its_claim_back_and_takes_nothing(
    redis_client: redis.Redis, keys: Keys, tasks: DecodeTasks
) -> None:
    """The claiming process died: its task runs again under the same id; the claimed job goes back to
    the queue's consuming end (the next message a worker fetches), to run as its own task."""
    enqueue(redis_client, tasks, "crashed-with-it", "later")
    claims = claims_of(redis_client, keys)
    assert claims.first("t", DECODE_QUEUE).job_id == "crashed-with-it"
    again = claims.first("t", DECODE_QUEUE)  # the same task, delivered again
    assert (again.outcome, again.job_id) == ("returned", None)
    assert not redis_client.exists(keys.decode_claim("t"))
    oldest_first = [job_of(m) for m in reversed(redis_client.lrange(keys.decode_queue(), 0, -1))]
    assert oldest_first == ["crashed-with-it", "later"]


def test_claiming_a_redelivered_task_puts_its_claim_back(
    redis_client: redis.Redis, keys: Keys, tasks: DecodeTasks
) -> None:
    """Task ``t`` died holding a claim; its message came back and another task claims it first: the
    job ``t`` held goes back to the queue then, not when ``t`` next runs (it never will)."""
    enqueue(redis_client, tasks, "held-by-t")
    claims = claims_of(redis_client, keys)
    assert claims.first("t", DECODE_QUEUE).job_id == "held-by-t"
    redis_client.rpush(keys.decode_queue(), tasks.message("t-own-job", task_id="t"))  # redelivered
    taken = claims.first("u", DECODE_QUEUE)
    assert (taken.outcome, taken.job_id) == ("claimed", "t-own-job")
    assert not redis_client.exists(keys.decode_claim("t"))
    assert [job_of(m) for m in redis_client.lrange(keys.decode_queue(), 0, -1)] == ["held-by-t"]


def test_messages_a_claim_cannot_run_stay_where_they_were(
    redis_client: redis.Redis, keys: Keys, tasks: DecodeTasks, redis_url: str
) -> None:
    """A countdown retry (``eta``) must wait for its time; another task's message is not ours."""
    settings = CommonSettings(_env_file=None, redis_url=redis_url, key_prefix=keys.prefix)  # type: ignore[call-arg]
    app = make_celery_app(settings)
    try:
        app.send_task(DECODE_TASK, args=["retry-later"], queue=DECODE_QUEUE, countdown=30)
        before = redis_client.lrange(keys.decode_queue(), 0, -1)
        claims = claims_of(redis_client, keys)
        assert claims.first("t", DECODE_QUEUE).outcome == "none"
        assert redis_client.lrange(keys.decode_queue(), 0, -1) == before
        redis_client.delete(keys.decode_queue())
        app.send_task("vlmq.other", args=["x"], queue=DECODE_QUEUE)
        before = redis_client.lrange(keys.decode_queue(), 0, -1)
        assert claims.first("t", DECODE_QUEUE).outcome == "none"
        assert redis_client.lrange(keys.decode_queue(), 0, -1) == before
        assert not redis_client.exists(keys.decode_claim("t"))
    finally:
        app.close()


def test_nothing_waiting_claims_nothing(redis_client: redis.Redis, keys: Keys) -> None:
    claims = claims_of(redis_client, keys)
    task = str(uuid.uuid4())
    nothing = claims.first(task, DECODE_QUEUE)
    assert nothing.outcome == "none"
    claims.release(task, DECODE_QUEUE, nothing)
    assert not redis_client.exists(keys.decode_claim(task))


def test_an_armed_claim_waits_for_the_next_job_and_keeps_it(
    redis_client: redis.Redis, keys: Keys, tasks: DecodeTasks
) -> None:
    """Nothing waits: the claim is armed (a list with the claim TTL), and ``wait`` takes the job
    pushed meanwhile the moment it arrives, into the task's claim (a string again, with its TTL)."""
    claims, task = claims_of(redis_client, keys), "lingering"
    armed = claims.first(task, DECODE_QUEUE, arm=True)
    assert armed.outcome == "armed"
    claim_key = keys.decode_claim(task)
    assert redis_client.type(claim_key) == b"list" and 0 < redis_client.ttl(claim_key) <= 60
    pusher = threading.Timer(0.2, enqueue, (redis_client, tasks, "arrived"))
    pusher.start()
    started = time.monotonic()
    taken = claims.wait(task, DECODE_QUEUE, timeout_s=5)
    pusher.join()
    assert (taken.outcome, taken.job_id) == ("claimed", "arrived") and time.monotonic() - started < 4
    assert job_of(redis_client.get(claim_key) or b"") == "arrived" and 0 < redis_client.ttl(claim_key) <= 60
    assert not redis_client.exists(keys.decode_queue())
    counted = redis_client.hget(keys.metrics_counters(), "decode_claimed_jobs_total")
    assert int(counted or 0) == 1
    again = claims.next(task, DECODE_QUEUE, taken, arm=True)
    assert again.outcome == "armed"
    assert claims.wait(task, DECODE_QUEUE, timeout_s=0.05).outcome == "released"
    assert not redis_client.exists(claim_key)


def test_a_task_that_died_waiting_puts_the_moved_job_back(
    redis_client: redis.Redis, keys: Keys, tasks: DecodeTasks
) -> None:
    """The child died after ``BLMOVE`` moved a job into its armed claim, before the claim was vetted:
    when its task runs again, or when another task claims its redelivered message, the job goes
    back to the queue's consuming end."""
    claims = claims_of(redis_client, keys)
    for other_task in (False, True):
        assert claims.first("t", DECODE_QUEUE, arm=True).outcome == "armed"
        enqueue(redis_client, tasks, "moved", "later")
        assert redis_client.blmove(keys.decode_queue(), keys.decode_claim("t"), 1, "RIGHT", "LEFT")
        if other_task:
            redis_client.rpush(keys.decode_queue(), tasks.message("t-own-job", task_id="t"))  # redelivered
            taken = claims.first("u", DECODE_QUEUE)
            assert taken.job_id == "t-own-job"
            claims.release("u", DECODE_QUEUE, taken)
        else:
            assert claims.first("t", DECODE_QUEUE, arm=True).outcome == "returned"
        oldest_first = [job_of(m) for m in reversed(redis_client.lrange(keys.decode_queue(), 0, -1))]
        assert oldest_first == ["moved", "later"] and not redis_client.exists(keys.decode_claim("t"))
        redis_client.delete(keys.decode_queue())


def test_what_a_wait_moved_is_kept_however_its_replies_went(
    redis_client: redis.Redis, keys: Keys, tasks: DecodeTasks
) -> None:
    """redis-py re-sends a command once after a connection error. A BLMOVE re-sent after its first
    run moved a job: the re-sent one times out (nothing else waits) or moves a second job; a vet
    re-sent after a lost reply. Each time the task keeps its first arrival, and the rest goes back
    first in line."""
    claims, claim_key, queue_key = claims_of(redis_client, keys), keys.decode_claim("t"), keys.decode_queue()
    claims.first("t", DECODE_QUEUE, arm=True)
    enqueue(redis_client, tasks, "moved")
    assert redis_client.blmove(queue_key, claim_key, 1, "RIGHT", "LEFT")  # its reply lost
    taken = claims.wait("t", DECODE_QUEUE, timeout_s=0.05)  # the re-sent BLMOVE times out
    assert (taken.outcome, taken.job_id) == ("claimed", "moved")
    assert claims.next("t", DECODE_QUEUE, taken, arm=True).outcome == "armed"
    enqueue(redis_client, tasks, "oldest", "second", "third")
    assert redis_client.blmove(queue_key, claim_key, 1, "RIGHT", "LEFT")  # its reply lost
    taken = claims.wait("t", DECODE_QUEUE, timeout_s=1)  # the re-sent BLMOVE moves "second"
    again = claims._call("t", DECODE_QUEUE, "vet")  # the vet, re-sent
    assert (taken.job_id, again.outcome, again.job_id) == ("oldest", "claimed", "oldest")
    assert [job_of(m) for m in reversed(redis_client.lrange(queue_key, 0, -1))] == ["second", "third"]
    assert 0 < redis_client.ttl(claim_key) <= 60


def test_a_claim_list_without_its_marker_is_still_the_tasks(
    redis_client: redis.Redis, keys: Keys, tasks: DecodeTasks
) -> None:
    """The arming was lost (a failover between it and the BLMOVE, which then made the list itself,
    with no marker and no TTL): the moved job is still kept by the wait, or put back when the task
    runs again; no key is left without a TTL."""
    claims, claim_key, queue_key = claims_of(redis_client, keys), keys.decode_claim("t"), keys.decode_queue()
    enqueue(redis_client, tasks, "moved", "later")
    assert redis_client.blmove(queue_key, claim_key, 1, "RIGHT", "LEFT")
    taken = claims.wait("t", DECODE_QUEUE, timeout_s=0.05)
    assert taken.job_id == "moved" and 0 < redis_client.ttl(claim_key) <= 60
    claims.release("t", DECODE_QUEUE, taken)
    assert redis_client.blmove(queue_key, claim_key, 1, "RIGHT", "LEFT")
    assert claims.first("t", DECODE_QUEUE).outcome == "returned"  # the task, run again
    assert [job_of(m) for m in redis_client.lrange(queue_key, 0, -1)] == ["later"]
    assert not redis_client.exists(claim_key) and redis_client.llen(queue_key) == 1


def test_a_wait_ends_at_a_message_no_claim_may_run(
    redis_client: redis.Redis, keys: Keys, redis_url: str
) -> None:
    """A countdown retry (``eta``) moved by the wait goes back where it was, and the wait ends."""
    claims, claim_key, queue_key = claims_of(redis_client, keys), keys.decode_claim("t"), keys.decode_queue()
    settings = CommonSettings(_env_file=None, redis_url=redis_url, key_prefix=keys.prefix)  # type: ignore[call-arg]
    app = make_celery_app(settings)
    try:
        assert claims.first("t", DECODE_QUEUE, arm=True).outcome == "armed"
        app.send_task(DECODE_TASK, args=["retry-later"], queue=DECODE_QUEUE, countdown=30)
        before = redis_client.lrange(queue_key, 0, -1)
        assert claims.wait("t", DECODE_QUEUE, timeout_s=1).outcome == "none"
        assert redis_client.lrange(queue_key, 0, -1) == before and not redis_client.exists(claim_key)
    finally:
        app.close()


def test_an_interactive_task_arms_only_while_its_workers_batch_queue_is_empty(
    redis_client: redis.Redis, keys: Keys, tasks: DecodeTasks
) -> None:
    """Every child of a worker waiting for interactive jobs would hold up the batch jobs it also
    serves: with batch work queued, such a task ends instead. A worker without the batch queue waits."""
    enqueue(redis_client, tasks, "batch-1", priority="batch")
    serving_both = claims_of(redis_client, keys)
    assert serving_both.first("t", DECODE_QUEUE, arm=True).outcome == "none"
    interactive_only = DecodeClaims(redis_client, keys, DECODE_TASK, 60, QUEUES, served=[DECODE_QUEUE])
    assert interactive_only.first("t", DECODE_QUEUE, arm=True).outcome == "armed"
    assert interactive_only.wait("t", DECODE_QUEUE, timeout_s=0.05).outcome == "released"
    assert not redis_client.exists(keys.decode_claim("t")) and redis_client.llen(
        keys.decode_queue(BATCH_QUEUE)
    )


def test_claiming_a_dead_tasks_message_ends_its_armed_claim(
    redis_client: redis.Redis, keys: Keys, tasks: DecodeTasks
) -> None:
    """Task ``t`` died while it waited (armed, nothing moved); its message came back and ``u`` claims
    it: ``t``'s armed list goes too (``t`` is not running)."""
    claims = claims_of(redis_client, keys)
    assert claims.first("t", DECODE_QUEUE, arm=True).outcome == "armed"
    redis_client.rpush(keys.decode_queue(), tasks.message("t-own-job", task_id="t"))  # redelivered
    taken = claims.first("u", DECODE_QUEUE)
    assert taken.job_id == "t-own-job" and not redis_client.exists(keys.decode_claim("t"))
    claims.release("u", DECODE_QUEUE, taken)
    assert not redis_client.exists(keys.decode_claim("u"), keys.decode_queue())


def test_a_wait_reads_the_job_it_took_in_the_vets_round_trip(
    redis_client: redis.Redis, keys: Keys, tasks: DecodeTasks
) -> None:
    """The moved job's first read rides on the vet's pipeline, its replies handed over with the
    claim; where the vet kept another job (a BLMOVE re-sent after a lost reply), no read is given."""
    claims = claims_of(redis_client, keys)
    probe = f"{keys.prefix}:probe:"
    redis_client.set(probe + "arrived", b"its record")

    def read_job(pipe: redis.client.Pipeline, job_id: str) -> None:
        pipe.get(probe + job_id)

    assert claims.first("t", DECODE_QUEUE, arm=True).outcome == "armed"
    pusher = threading.Timer(0.2, enqueue, (redis_client, tasks, "arrived"))
    pusher.start()
    taken = claims.wait("t", DECODE_QUEUE, timeout_s=5, read_job=read_job)
    pusher.join()
    assert (taken.job_id, taken.read) == ("arrived", [b"its record"])
    assert claims.next("t", DECODE_QUEUE, taken, arm=True).outcome == "armed"
    enqueue(redis_client, tasks, "oldest", "second")
    assert redis_client.blmove(keys.decode_queue(), keys.decode_claim("t"), 1, "RIGHT", "LEFT")  # reply lost
    taken = claims.wait("t", DECODE_QUEUE, timeout_s=1, read_job=read_job)  # moves "second"
    assert (taken.job_id, taken.read) == ("oldest", None)
    redis_client.delete(probe + "arrived")
