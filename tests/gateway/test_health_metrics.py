"""/healthz, /readyz from worker heartbeats, /metrics with the workers' figures from Redis."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from shared import metrics_hash, workers
from shared.keys import Keys
from tests.support.stack import ServiceStack

ENGINE_STATS = {
    "running": 2,
    "waiting": 1,
    "max_batch": 8,
    "healthy": True,
    "steps": 40,
    "batch_sizes": {"1": 10, "4": 30},
    "caches": {"prefix": {"hits": 9, "misses": 1, "entries": 1}, "session": {"hits": 3, "misses": 1}},
}


def heartbeat(
    worker_id: str = "w1", *, healthy: bool = True, age_s: float = 0.0, error: str | None = None
) -> str:
    return json.dumps(
        {
            "worker_id": worker_id,
            "model": "vlmq-tiny",
            "quantize": "none",
            "device": "cpu",
            "healthy": healthy,
            "last_error": error,
            "ts": time.time() - age_s,
            "engine": ENGINE_STATS,
        }
    )


def register(r: redis.Redis, keys: Keys, beat: str) -> None:
    """What an inference worker's heartbeat writes (``shared.workers.publish``)."""
    pipe = r.pipeline()
    workers.publish(pipe, keys, json.loads(beat), ttl_ms=60_000)
    pipe.execute()


@pytest.fixture
def clean_workers(gateway: ServiceStack, r: redis.Redis) -> Iterator[None]:
    def wipe() -> None:
        for key in workers.heartbeat_keys(gateway.keys, list(r.zrange(gateway.keys.workers(), 0, -1))):
            r.delete(key)
        r.delete(gateway.keys.workers(), gateway.keys.metrics_counters())

    wipe()
    yield
    wipe()


async def test_healthz(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}


async def test_readyz(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis, clean_workers: None
) -> None:
    resp = await client.get("/readyz")
    assert resp.status_code == 503 and "no inference worker" in " ".join(resp.json()["reasons"])

    register(r, gateway.keys, heartbeat(age_s=30))
    resp = await client.get("/readyz")  # a stale heartbeat is no worker
    assert resp.status_code == 503 and "no inference worker" in " ".join(resp.json()["reasons"])

    register(r, gateway.keys, heartbeat(healthy=False, error="forward failed"))
    resp = await client.get("/readyz")
    assert resp.status_code == 503 and "forward failed" in " ".join(resp.json()["reasons"])

    register(r, gateway.keys, heartbeat())
    resp = await client.get("/readyz")
    assert resp.status_code == 200 and resp.json()["workers_ready"] == 1


async def test_metrics(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis, clean_workers: None
) -> None:
    keys = gateway.keys
    register(r, keys, heartbeat())
    pipe = r.pipeline()
    metrics_hash.inc(pipe, keys.metrics_counters(), "jobs_total", outcome="done")
    metrics_hash.inc(pipe, keys.metrics_counters(), "jobs_total", 2, outcome="failed")
    for value in (0.004, 0.03, 0.2):
        metrics_hash.observe(pipe, keys.metrics_counters(), "stage_seconds", value, stage="decode")
    pipe.execute()
    files = {"image": ("a.jpg", b"\xff\xd8\xff" + b"0" * 10, "image/jpeg")}
    await client.post("/v1/jobs", data={"prompt": "x"}, files=files)  # a 400: counted as nothing accepted

    resp = await client.get("/metrics")
    assert resp.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(resp.text)}
    depth = {s.labels["queue"]: s.value for s in families["vlmq_queue_depth"].samples}
    assert set(depth) == {"inference", "decode", "decode.batch"} and depth["decode"] >= 0
    jobs = {
        s.labels["outcome"]: s.value for s in families["vlmq_jobs"].samples if s.name == "vlmq_jobs_total"
    }
    assert jobs == {"done": 1.0, "failed": 2.0}
    stage = families["vlmq_stage_seconds"]
    assert stage.type == "histogram"
    samples = {(s.name, s.labels.get("le")): s.value for s in stage.samples}
    assert samples[("vlmq_stage_seconds_count", None)] == 3
    assert samples[("vlmq_stage_seconds_bucket", "0.05")] == 2
    assert samples[("vlmq_stage_seconds_bucket", "+Inf")] == 3
    batch = {
        s.labels.get("le"): s.value for s in families["vlmq_batch_size"].samples if s.name.endswith("_bucket")
    }
    assert batch == {"1.0": 10, "4.0": 40, "+Inf": 40}
    ratios = {s.labels["cache"]: s.value for s in families["vlmq_cache_hit_ratio"].samples}
    assert ratios == {"prefix": 0.9, "session": 0.75}
    assert families["vlmq_engine_running"].samples[0].value == 2
    assert families["vlmq_workers_alive"].samples[0].value == 1
    assert "vlmq_gateway_jobs_submitted" in families
    rejected = {
        x.labels["status"]: x.value
        for x in families["vlmq_gateway_requests_rejected"].samples
        if x.name.endswith("_total")
    }
    assert rejected.get("400", 0) >= 1  # the corrupt upload above


async def test_readyz_and_metrics_never_walk_the_keyspace(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis, clean_workers: None
) -> None:
    """O(1) Redis work per call: no SCAN/KEYS, whatever the number of keys (1.3M made /readyz time out)."""
    register(r, gateway.keys, heartbeat())

    def walks() -> int:
        stats = r.info("commandstats")
        return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("scan", "keys"))

    before = walks()
    for _ in range(3):
        assert (await client.get("/readyz")).status_code == 200
        assert (await client.get("/metrics")).status_code == 200
    assert walks() == before
