"""The consumer group against a real Redis: delivery, claim of idle entries, renewal, pruning."""

from __future__ import annotations

import time
from typing import Any

from services.inference_worker.stream_consumer import StreamConsumer
from shared.keys import Keys


def consumers(r: Any, keys: Keys, *names: str) -> list[StreamConsumer]:
    out = [StreamConsumer(r, keys, name) for name in names]
    for consumer in out:
        consumer.ensure_groups()
    out[0].ensure_groups()  # idempotent
    return out


def test_idle_entries_of_a_dead_consumer_are_claimed_but_renewed_ones_are_not(
    redis_client: Any, keys: Keys
) -> None:
    dead, live = consumers(redis_client, keys, "dead", "live")
    for job in ("a", "b"):
        redis_client.xadd(keys.inference_stream(), {"job_id": job})
    got = dead.read(2, 10)
    assert [e.job_id for e in got] == ["a", "b"]
    time.sleep(0.25)
    dead.renew([got[1]])  # "b" is still being worked on
    claimed = live.claim_idle(200, 10, [keys.inference_stream()])
    assert [e.job_id for e in claimed] == ["a"]
    pipe = redis_client.pipeline()
    live.ack(pipe, claimed[0])
    pipe.execute()
    assert redis_client.xlen(keys.inference_stream()) == 1
    assert redis_client.xpending(keys.inference_stream(), "inference")["pending"] == 1


def test_restarted_consumer_with_the_same_name_gets_its_pending_entries(
    redis_client: Any, keys: Keys
) -> None:
    (first,) = consumers(redis_client, keys, "w1")
    redis_client.xadd(keys.inference_stream(), {"job_id": "x"})
    assert [e.job_id for e in first.read(1, 10)] == ["x"]
    again = StreamConsumer(redis_client, keys, "w1")
    assert [e.job_id for e in again.read(5, 0, own_pending=True)] == ["x"]


def test_prune_forgets_only_idle_consumers_without_pending_entries(redis_client: Any, keys: Keys) -> None:
    me, idle, busy = consumers(redis_client, keys, "me", "idle", "busy")
    redis_client.xgroup_createconsumer(keys.inference_stream(), "inference", idle.consumer)
    redis_client.xadd(keys.inference_stream(), {"job_id": "y"})
    busy.read(1, 10)
    time.sleep(0.05)
    assert me.prune_consumers(min_idle_ms=10) == 1
    names = {c["name"].decode() for c in redis_client.xinfo_consumers(keys.inference_stream(), "inference")}
    assert names == {"busy"}


def test_a_worker_reads_its_own_stream_before_the_shared_one(redis_client: Any, keys: Keys) -> None:
    (me,) = consumers(redis_client, keys, "me")
    redis_client.xadd(keys.inference_stream(), {"job_id": "anyone"})
    redis_client.xadd(keys.worker_stream("me"), {"job_id": "mine"})
    got = me.read(2, 10)
    assert [(e.stream, e.job_id) for e in got] == [
        (keys.worker_stream("me"), "mine"),
        (keys.inference_stream(), "anyone"),
    ]
    pipe = redis_client.pipeline()
    for entry in got:
        me.ack(pipe, entry)  # each in its own stream
    pipe.execute()
    assert redis_client.xlen(keys.worker_stream("me")) == redis_client.xlen(keys.inference_stream()) == 0
