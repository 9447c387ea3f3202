"""/healthz, /readyz from worker heartbeats, /metrics with the workers' figures from Redis."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest
import redis
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from gateway.metrics_workers import ENGINE_COUNTERS, ENGINE_GAUGES, MAPPED_ELSEWHERE
from services.engine.stats import EngineStats
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
        metrics_hash.observe(
            pipe, keys.metrics_counters(), "request_queue_time_seconds", value, stage="decode"
        )
    pipe.execute()
    files = {"image": ("a.jpg", b"\xff\xd8\xff" + b"0" * 10, "image/jpeg")}
    await client.post("/v1/jobs", data={"prompt": "x"}, files=files)  # a 400: counted as nothing accepted

    resp = await client.get("/metrics")
    assert resp.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(resp.text)}
    depth = {s.labels["queue"]: s.value for s in families["vlmq_queue_depth"].samples}
    assert set(depth) == {"inference", "decode", "decode.batch"} and depth["decode"] >= 0
    jobs = families["vlmq_jobs"]
    assert jobs.type == "counter"
    assert {s.labels["outcome"]: s.value for s in jobs.samples if s.name == "vlmq_jobs_total"} == {
        "done": 1.0,
        "failed": 2.0,
    }
    queued = families["vlmq_request_queue_time_seconds"]
    assert queued.type == "histogram"
    samples = {(s.name, s.labels.get("le")): s.value for s in queued.samples}
    assert samples[("vlmq_request_queue_time_seconds_count", None)] == 3
    assert samples[("vlmq_request_queue_time_seconds_bucket", "0.05")] == 2
    assert samples[("vlmq_request_queue_time_seconds_bucket", "+Inf")] == 3
    batch = families["vlmq_engine_batch_size"]
    buckets = {s.labels["le"]: s.value for s in batch.samples if s.name.endswith("_bucket")}
    assert batch.type == "histogram" and buckets["1.0"] == 10 and buckets["2.0"] == 10
    assert buckets["4.0"] == buckets["256.0"] == buckets["+Inf"] == 40
    assert sample_value(families, "vlmq_engine_batch_size_sum") == 10 * 1 + 30 * 4
    assert cache_figures(families) == {"prefix": (9, 10), "session": (3, 4)}
    assert families["vlmq_engine_steps"].type == "counter"
    assert sample_value(families, "vlmq_engine_steps_total") == 40
    assert sample_value(families, "vlmq_num_requests_running") == 2
    assert sample_value(families, "vlmq_workers_alive") == 1
    rejected = {
        x.labels["status"]: x.value
        for x in families["vlmq_gateway_requests_rejected"].samples
        if x.name.endswith("_total")
    }
    assert rejected.get("400", 0) >= 1  # the corrupt upload above


def sample_value(families: dict[str, Metric], sample: str) -> float:
    """The one sample called ``sample`` (its family: the name without a _total/_sum/... suffix)."""
    found = [s.value for f in families.values() for s in f.samples if s.name == sample]
    assert len(found) == 1, (sample, found)
    return found[0]


def cache_figures(families: dict[str, Metric]) -> dict[str, tuple[float, float]]:
    """{cache: (hits, lookups)} from the counters."""
    hits = {
        s.labels["cache"]: s.value for s in families["vlmq_cache_hits"].samples if s.name.endswith("_total")
    }
    lookups = {
        s.labels["cache"]: s.value
        for s in families["vlmq_cache_lookups"].samples
        if s.name.endswith("_total")
    }
    return {cache: (hits[cache], lookups[cache]) for cache in hits}


def test_every_engine_stat_is_exported() -> None:
    """A new EngineStats field needs a decision: counter, gauge or something else (metrics_workers)."""
    mapped = set(ENGINE_GAUGES) | set(ENGINE_COUNTERS) | MAPPED_ELSEWHERE
    assert set(EngineStats().to_dict()) <= mapped, set(EngineStats().to_dict()) - mapped


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
