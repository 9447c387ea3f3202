"""Prometheus metrics: the gateway's own, plus the workers' figures read from Redis.

Workers publish into Redis (heartbeat JSON with engine stats, a counters hash in the
``shared.metrics_hash`` format); ``/metrics`` takes a snapshot of those with the async
client, then a custom collector turns the snapshot into ``vlmq_*`` families.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.queues import QueueFigures, read_queues
from shared import workers
from shared.keys import Keys
from shared.metrics_hash import parse_series
from shared.values import as_str


@dataclass
class RedisSnapshot:
    queues: QueueFigures = field(default_factory=QueueFigures)
    heartbeats: list[dict[str, Any]] = field(default_factory=list)
    counters: dict[str, float] = field(default_factory=dict)


async def read_heartbeats(redis: aioredis.Redis, keys: Keys, stale_s: float) -> list[dict[str, Any]]:
    """Heartbeats of the workers registered within ``stale_s`` (``shared.workers``: no SCAN)."""
    ids: list[Any] = await redis.zrangebyscore(keys.workers(), time.time() - stale_s, "+inf")
    return workers.parse(await redis.mget(workers.heartbeat_keys(keys, ids))) if ids else []


async def take_snapshot(redis: aioredis.Redis, keys: Keys, stale_s: float) -> RedisSnapshot:
    """Everything /metrics shows from Redis, in O(workers) commands (no SCAN)."""
    counters = await redis.hgetall(keys.metrics_counters())
    return RedisSnapshot(
        queues=await read_queues(redis, keys),
        heartbeats=await read_heartbeats(redis, keys, stale_s),
        counters={as_str(k): _num(v) for k, v in counters.items() if _num(v) is not None},  # type: ignore[misc]
    )


BACKLOG_METRIC = "vlmq_inference_backlog"  # what autoscalers scale inference on (k8s/components/keda)


def queue_families(queues: QueueFigures) -> Iterator[Metric]:
    """Queue depths, and the inference backlog autoscalers scale on (every stream's unread entries)."""
    depth = GaugeMetricFamily(
        "vlmq_queue_depth", "Jobs per queue: decode tasks waiting, inference jobs in flight", labels=["queue"]
    )
    depth.add_metric(["inference"], queues.inference_in_flight)
    for queue, waiting in queues.decode.items():
        depth.add_metric([queue], waiting)
    yield depth
    backlog = GaugeMetricFamily(
        BACKLOG_METRIC,
        "Inference jobs no worker has read yet, per stream (shared, or a worker's own)",
        labels=["stream"],
    )
    for name, figures in sorted(queues.inference.items()):
        backlog.add_metric([name], figures.backlog)
    yield backlog


def flatten(stats: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    """Nested engine stats -> (snake_name, number); non-numeric leaves are skipped."""
    for key, value in stats.items():
        name = f"{prefix}_{key}" if prefix else str(key)
        if isinstance(value, dict):
            yield from flatten(value, name)
        elif isinstance(value, bool) or (isinstance(value, int | float) and math.isfinite(value)):
            yield _clean(name), float(value)


class RedisFiguresCollector(Collector):
    """Yields the last snapshot; the /metrics route refreshes it just before generating."""

    def __init__(self, stale_s: float) -> None:
        self.snapshot = RedisSnapshot()
        self.stale_s = stale_s

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot
        yield from queue_families(snap.queues)
        yield from self._workers(snap.heartbeats)
        yield from counter_families(snap.counters)

    def _workers(self, beats: list[dict[str, Any]]) -> Iterator[Metric]:
        now = time.time()
        fresh = [b for b in beats if now - float(b.get("ts", 0)) <= self.stale_s]
        alive = GaugeMetricFamily("vlmq_workers_alive", "Inference workers with a fresh heartbeat")
        alive.add_metric([], len(fresh))
        yield alive
        healthy = GaugeMetricFamily(
            "vlmq_worker_healthy", "1 when the worker reports healthy", labels=["worker"]
        )
        engine: dict[str, GaugeMetricFamily] = {}
        ratios = GaugeMetricFamily(
            "vlmq_cache_hit_ratio", "Hits / lookups per engine cache", labels=["worker", "cache"]
        )
        for beat in fresh:
            worker = str(beat.get("worker_id", "?"))
            healthy.add_metric([worker], 1.0 if beat.get("healthy") else 0.0)
            stats = dict(flatten(beat.get("engine") or {}))
            for name, value in stats.items():
                family = engine.setdefault(
                    name, GaugeMetricFamily(f"vlmq_engine_{name}", f"Engine stat {name}", labels=["worker"])
                )
                family.add_metric([worker], value)
            for cache, ratio in hit_ratios(stats).items():
                ratios.add_metric([worker, cache], ratio)
        yield healthy
        yield ratios
        yield from engine.values()
        yield batch_size_histogram(fresh)


def batch_size_histogram(beats: list[dict[str, Any]]) -> Metric:
    """Engine ``batch_sizes`` ({size: decode steps}) -> a histogram of the running batch size."""
    family = HistogramMetricFamily("vlmq_batch_size", "Running batch size per decode step", labels=["worker"])
    for beat in beats:
        sizes = (beat.get("engine") or {}).get("batch_sizes") or {}
        try:
            steps = sorted((int(k), float(v)) for k, v in sizes.items())
        except (TypeError, ValueError):
            continue
        buckets, total, weighted = [], 0.0, 0.0
        for size, count in steps:
            total += count
            weighted += size * count
            buckets.append((str(float(size)), total))
        buckets.append(("+Inf", total))
        family.add_metric([str(beat.get("worker_id", "?"))], buckets, weighted)
    return family


def hit_ratios(stats: dict[str, float]) -> dict[str, float]:
    """``<cache>_hits`` with ``<cache>_misses`` (or ``_lookups``) -> hit ratio per cache."""
    ratios = {}
    for name, hits in stats.items():
        if not name.endswith("_hits"):
            continue
        base = name.removesuffix("_hits")
        lookups = stats.get(f"{base}_lookups")
        if lookups is None and f"{base}_misses" in stats:
            lookups = hits + stats[f"{base}_misses"]
        if lookups:
            ratios[base.removeprefix("caches_").removesuffix("_cache") or base] = hits / lookups
    return ratios


def counter_families(counters: dict[str, float]) -> Iterator[Metric]:
    """The counters hash -> histogram / counter / gauge families named ``vlmq_*``."""
    grouped: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for fieldname, value in counters.items():
        parsed = parse_series(fieldname)
        if parsed is not None:
            grouped[parsed[0]].append((parsed[1], value))
    histograms = {n.removesuffix("_bucket") for n in grouped if n.endswith("_bucket")}
    for base in sorted(histograms):
        yield _histogram(base, grouped)
    for name, samples in sorted(grouped.items()):
        if any(name == f"{h}{s}" for h in histograms for s in ("_bucket", "_sum", "_count")):
            continue
        yield _simple(name, samples)


def _histogram(base: str, grouped: dict[str, list[tuple[dict[str, str], float]]]) -> Metric:
    by_labels: dict[tuple[tuple[str, str], ...], list[tuple[str, float]]] = defaultdict(list)
    for labels, value in grouped.get(f"{base}_bucket", []):
        rest = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
        by_labels[rest].append((labels.get("le", "+Inf"), value))
    sums = {tuple(sorted(lb.items())): v for lb, v in grouped.get(f"{base}_sum", [])}
    label_names = sorted({k for key in by_labels for k, _ in key})
    family = HistogramMetricFamily(_prefixed(base), f"{base} (from workers)", labels=label_names)
    for key, buckets in by_labels.items():
        ordered = sorted(buckets, key=lambda b: float(b[0]))
        if ordered and ordered[-1][0] != "+Inf":
            ordered.append(("+Inf", ordered[-1][1]))
        label_map = dict(key)
        family.add_metric([label_map.get(n, "") for n in label_names], ordered, sums.get(key, 0.0))
    return family


def _simple(name: str, samples: list[tuple[dict[str, str], float]]) -> Metric:
    label_names = sorted({k for labels, _ in samples for k in labels})
    family: Metric
    if name.endswith("_total"):
        family = CounterMetricFamily(
            _prefixed(name.removesuffix("_total")), f"{name} (from workers)", labels=label_names
        )
    else:
        family = GaugeMetricFamily(_prefixed(name), f"{name} (from workers)", labels=label_names)
    for labels, value in samples:
        family.add_metric([labels.get(n, "") for n in label_names], value)  # type: ignore[attr-defined]
    return family


class GatewayMetrics:
    """The gateway's own metrics, in a private registry (several apps per test process)."""

    def __init__(self, stale_s: float = 10.0) -> None:
        self.registry = CollectorRegistry()
        self.submitted = Counter(
            "vlmq_gateway_jobs_submitted", "Jobs accepted by the gateway", ["source"], registry=self.registry
        )
        self.rejected = Counter(
            "vlmq_gateway_requests_rejected",
            "Requests refused, by status",
            ["status"],
            registry=self.registry,
        )
        self.result_cache = Counter(
            "vlmq_gateway_result_cache_lookups", "Result cache lookups", ["result"], registry=self.registry
        )
        self.open_streams = Gauge(
            "vlmq_gateway_open_streams", "Open event streams", ["kind"], registry=self.registry
        )
        self.auth_failures = Counter(
            "vlmq_gateway_auth_failures",
            "Requests refused for a missing or wrong API key",
            ["kind"],
            registry=self.registry,
        )
        self.submit_seconds = Histogram(
            "vlmq_gateway_submit_seconds", "Time to accept a job (202)", registry=self.registry
        )
        self.redis_figures = RedisFiguresCollector(stale_s)
        self.registry.register(self.redis_figures)

    async def render(self, redis: aioredis.Redis, keys: Keys) -> bytes:
        self.redis_figures.snapshot = await take_snapshot(redis, keys, self.redis_figures.stale_s)
        return generate_latest(self.registry)


def _prefixed(name: str) -> str:
    return name if name.startswith("vlmq_") else f"vlmq_{name}"


def _clean(name: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)


def _num(value: Any) -> float | None:
    try:
        return float(as_str(value))
    except ValueError:
        return None
