"""Routing's safety nets against a real Redis: a busy owner's unread entries move to the shared
stream after the bound, a dead owner's at once, its read ones are claimed, its stream forgotten."""

from __future__ import annotations

import time
from typing import Any

from services.inference_worker.affinity import Rebalancer
from services.inference_worker.stream_consumer import StreamConsumer
from shared import workers
from shared.config import InferenceSettings
from shared.keys import Keys


def settings(keys: Keys, max_wait_ms: int) -> InferenceSettings:
    return InferenceSettings(  # type: ignore[call-arg]
        _env_file=None, key_prefix=keys.prefix, affinity_max_wait_ms=max_wait_ms, worker_stale_s=5
    )


def beat(r: Any, keys: Keys, worker_id: str, age_s: float = 0.0) -> None:
    pipe = r.pipeline()
    workers.publish(pipe, keys, {"worker_id": worker_id, "ts": time.time() - age_s}, ttl_ms=60_000)
    pipe.execute()


def route(r: Any, keys: Keys, worker_id: str, job_id: str) -> str:
    """What HANDOFF_LUA does for a routed job: the entry in the owner's stream, noted in the job."""
    entry = r.xadd(keys.worker_stream(worker_id), {"job_id": job_id}).decode()
    r.hset(keys.job(job_id), mapping={"entry_id": entry, "entry_stream": keys.worker_stream(worker_id)})
    return entry


def test_a_busy_owners_unread_entries_move_after_the_bound(redis_client: Any, keys: Keys) -> None:
    r = redis_client
    owner = StreamConsumer(r, keys, "busy")
    owner.ensure_groups()
    beat(r, keys, "busy")
    route(r, keys, "busy", "read-it")
    assert [e.job_id for e in owner.read(1, 10)] == ["read-it"]  # delivered: stays with its owner
    route(r, keys, "busy", "waiting")
    rebalancer = Rebalancer(r, settings(keys, 300), "other")
    assert rebalancer.rebalance() == 0  # younger than the bound
    time.sleep(0.35)
    assert rebalancer.rebalance() == 1
    (moved,) = r.xrange(keys.inference_stream())
    assert moved[1][b"job_id"] == b"waiting"
    assert r.hget(keys.job("waiting"), "entry_id") == moved[0]  # the sweeper looks for it there now
    assert r.hget(keys.job("waiting"), "entry_stream").decode() == keys.inference_stream()
    assert [f[b"job_id"] for _, f in r.xrange(keys.worker_stream("busy"))] == [b"read-it"]


def test_a_dead_owner_gives_everything_back_and_is_forgotten(redis_client: Any, keys: Keys) -> None:
    r = redis_client
    dead = StreamConsumer(r, keys, "dead")
    dead.ensure_groups()
    beat(r, keys, "dead", age_s=60)  # its heartbeat is long gone
    route(r, keys, "dead", "read")
    dead.read(1, 10)
    route(r, keys, "dead", "unread")
    survivor = StreamConsumer(r, keys, "alive")
    survivor.ensure_groups()
    beat(r, keys, "alive")
    rebalancer = Rebalancer(r, settings(keys, 10_000), "alive")
    assert rebalancer.rebalance() == 1  # at once, whatever the bound
    assert [f[b"job_id"] for _, f in r.xrange(keys.inference_stream())] == [b"unread"]
    time.sleep(0.1)
    claimed = survivor.claim_idle(50, 10, rebalancer.claim_streams())
    assert [e.job_id for e in claimed] == ["read"]
    pipe = r.pipeline()
    survivor.ack(pipe, claimed[0])
    pipe.execute()
    rebalancer.rebalance()
    assert not r.exists(keys.worker_stream("dead"))
    assert r.zscore(keys.workers(), "dead") is None
