"""VLMQ_REDIS_MIN_REPLICAS: WAIT before the gateway's 202 and before the inference worker's XACK.

Gateway: against the test Redis, which has no replica, a submission cannot be replicated: 503,
and what the first MULTI wrote is failed ``queue_unavailable`` (not accepted, not enqueued, no
conversation, out of the admission count). Inference worker: with its replica paused, a finished
job's terminal state is written but its stream entry is not acknowledged.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import httpx

from services.inference_worker.after_finish import WriterConfig
from services.inference_worker.event_writer import EventWriter
from shared.jobs import JobRecord
from shared.keys import INFERENCE_GROUP, Keys
from shared.redis_clients import SentinelOptions, sync_client
from shared.schemas import JobStatus
from tests.services.inference_worker.test_event_writer import Harness, events_of
from tests.support.jobs import image_bytes
from tests.support.sentinel import MASTER_NAME, SentinelCluster
from tests.support.stack import ServiceStack

WAIT_ENV = {"VLMQ_REDIS_MIN_REPLICAS": "1", "VLMQ_REDIS_WAIT_MS": "200"}


async def test_a_job_no_replica_acknowledged_is_refused_and_failed(
    stack_factory: Callable[..., ServiceStack],
) -> None:
    gateway = stack_factory(components=("gateway",), extra_env=WAIT_ENV)
    r, keys = gateway.redis, gateway.keys
    files = {"image": ("a.jpg", image_bytes("JPEG", (64, 48)), "image/jpeg")}
    form = {"prompt": "Hi", "session_id": "ha-session-1"}
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=30) as client:
        resp = await client.post("/v1/jobs", data=form, files=files)
    assert resp.status_code == 503 and resp.headers["Retry-After"] == "1"
    error = resp.json()["error"]
    assert error["code"] == "queue_unavailable" and "0 of 1 Redis replicas" in error["message"]
    (job_key,) = [k for k in r.keys(f"{keys.prefix}:job:*") if not k.endswith(b":events")]
    record = JobRecord.from_hash(r.hgetall(job_key))
    assert record.status is JobStatus.FAILED and record.error_code == "queue_unavailable"
    assert r.llen(keys.decode_queue()) == 0  # never enqueued
    assert not r.exists(keys.conversation("ha-session-1"))  # the conversation is untouched
    assert r.zcard(keys.active_jobs()) == 0  # not counted against admission


def test_the_worker_acknowledges_only_what_a_replica_holds(cluster: SentinelCluster, keys: Keys) -> None:
    cluster.wait_replicas_in_sync(1)  # WAIT counts only a replica whose link is up
    client = sync_client(cluster.url, sentinel=SentinelOptions(MASTER_NAME))
    harness = Harness(client, keys)
    config = WriterConfig("model-x", 600, 600, min_replicas=1, wait_ms=2000)  # a loaded replica acks late
    harness.writer = EventWriter(
        client,
        harness.store,
        harness.consumer,
        config,
        lambda run: harness.finished.append(run.job_id),
        harness.cancelled.append,
    )
    stream = harness.keys.inference_stream()
    replicated = harness.start_job(session=False)
    harness.writer.write([(replicated, e) for e in events_of(replicated, ["a", "b"])])
    assert client.xpending(stream, INFERENCE_GROUP)["pending"] == 0  # WAIT answered 1: acknowledged

    unreplicated = harness.start_job(session=False)
    (replica,) = cluster.replicas()
    replica.process.send_signal(signal.SIGSTOP)
    try:
        harness.writer.write([(unreplicated, e) for e in events_of(unreplicated, ["c"])])
    finally:
        replica.process.send_signal(signal.SIGCONT)
    record = JobRecord.from_hash(client.hgetall(harness.keys.job(unreplicated.job_id)))
    assert record.status is JobStatus.DONE  # the terminal state is written...
    pending: Any = client.xpending_range(stream, INFERENCE_GROUP, "-", "+", 10)
    assert [p["message_id"].decode() for p in pending] == [unreplicated.entry.entry_id]  # ...not acked
