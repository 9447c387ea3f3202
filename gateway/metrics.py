"""Prometheus metrics: the gateway's own, plus the cluster's figures read from Redis.

The gateway's own (this replica's requests) are prometheus-client objects in a private registry
(several apps per test process); the cluster's (queues, workers, the workers' counters hash)
come from ``gateway.metrics_redis``, the same on every replica.
"""

from __future__ import annotations

import redis.asyncio as aioredis
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)

from gateway.metrics_redis import RedisFiguresCollector, take_snapshot
from shared.keys import Keys

disable_created_metrics()  # the text format would show each counter's _created as a gauge family
SUBMIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class GatewayMetrics:
    def __init__(self, stale_s: float = 10.0) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        # route: jobs, openai, ws, batch (the batch API's lines), retry (a dead letter resubmitted)
        self.submitted = Counter("vlmq_gateway_jobs_submitted", "Jobs accepted", ["route"], registry=r)
        self.submit_seconds = Histogram(
            "vlmq_gateway_submit_seconds",
            "Request in -> job accepted (checks, image, writes, enqueue), refusals included",
            ["route"],
            buckets=SUBMIT_BUCKETS,
            registry=r,
        )
        self.rejected = Counter(
            "vlmq_gateway_requests_rejected", "Requests refused, by status", ["status"], registry=r
        )
        self.result_cache_lookups = Counter(
            "vlmq_gateway_result_cache_lookups", "Result cache lookups", registry=r
        )
        self.result_cache_hits = Counter(
            "vlmq_gateway_result_cache_hits", "Result cache lookups that hit", registry=r
        )
        self.open_streams = Gauge("vlmq_gateway_open_streams", "Open event streams", ["kind"], registry=r)
        self.auth_failures = Counter(
            "vlmq_gateway_auth_failures",
            "Requests refused for a missing or wrong API key",
            ["kind"],
            registry=r,
        )
        ProcessCollector(registry=r)  # process_cpu_seconds_total, process_resident_memory_bytes, ...
        self.redis_figures = RedisFiguresCollector(stale_s)
        r.register(self.redis_figures)

    async def render(self, redis: aioredis.Redis, keys: Keys) -> bytes:
        self.redis_figures.snapshot = await take_snapshot(redis, keys, self.redis_figures.stale_s)
        return generate_latest(self.registry)
