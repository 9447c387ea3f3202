"""The cluster's figures in Redis -> ``vlmq_*`` families: queue depths, the inference backlog,
the workers' heartbeats (``gateway.metrics_workers``) and the counters hash (``shared.metrics_hash``).

``/metrics`` takes a snapshot with the async client, then ``RedisFiguresCollector`` turns it into
families. Every gateway replica shows the same cluster-wide figures: aggregate them across
gateways with ``max`` (``sum by (stream) (max without (instance, pod) (...))``), never ``sum``.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.metrics_workers import worker_families
from gateway.queues import QueueFigures, read_queues
from shared import workers
from shared.keys import Keys
from shared.metrics_hash import FAMILIES, parse_series
from shared.values import as_str

BACKLOG_METRIC = "vlmq_inference_backlog"  # what autoscalers scale inference on (k8s/components/keda)
Samples = list[tuple[dict[str, str], float]]


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


class RedisFiguresCollector(Collector):
    """Yields the last snapshot; the /metrics route refreshes it just before generating."""

    def __init__(self, stale_s: float) -> None:
        self.snapshot = RedisSnapshot()
        self.stale_s = stale_s

    def collect(self) -> Iterator[Metric]:
        snap, now = self.snapshot, time.time()
        yield from queue_families(snap.queues)
        yield from worker_families(
            [b for b in snap.heartbeats if now - _num_or_0(b.get("ts")) <= self.stale_s]
        )
        yield from hash_families(snap.counters)


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
        "Inference jobs no worker has read yet, per stream (shared, batch, or a worker's own)",
        labels=["stream"],
    )
    for name, figures in sorted(queues.inference.items()):
        backlog.add_metric([name], figures.backlog)
    yield backlog


def hash_families(counters: dict[str, float]) -> Iterator[Metric]:
    """The counters hash -> one family per ``FAMILIES`` entry (present even when empty)."""
    grouped: dict[str, Samples] = defaultdict(list)
    for fieldname, value in counters.items():
        parsed = parse_series(fieldname)
        if parsed is not None:
            grouped[parsed[0]].append((parsed[1], value))
    for name, family in FAMILIES.items():
        if family.kind == "histogram":
            yield _histogram(name, family.help, grouped)
        else:
            yield _counter(name, family.help, grouped.get(name, []))


def _histogram(base: str, doc: str, grouped: dict[str, Samples]) -> Metric:
    by_labels: dict[tuple[tuple[str, str], ...], list[tuple[str, float]]] = defaultdict(list)
    for labels, value in grouped.get(f"{base}_bucket", []):
        rest = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
        by_labels[rest].append((labels.get("le", "+Inf"), value))
    sums = {tuple(sorted(lb.items())): v for lb, v in grouped.get(f"{base}_sum", [])}
    label_names = sorted({k for key in by_labels for k, _ in key})
    family = HistogramMetricFamily(f"vlmq_{base}", doc, labels=label_names)
    for key, buckets in by_labels.items():
        ordered = sorted(buckets, key=lambda b: float(b[0]))
        if ordered and ordered[-1][0] != "+Inf":
            ordered.append(("+Inf", ordered[-1][1]))
        label_map = dict(key)
        family.add_metric([label_map.get(n, "") for n in label_names], ordered, sums.get(key, 0.0))
    return family


def _counter(name: str, doc: str, samples: Samples) -> Metric:
    label_names = sorted({k for labels, _ in samples for k in labels})
    family = CounterMetricFamily(f"vlmq_{name.removesuffix('_total')}", doc, labels=label_names)
    for labels, value in samples:
        family.add_metric([labels.get(n, "") for n in label_names], value)
    return family


def _num(value: Any) -> float | None:
    try:
        return float(as_str(value))
    except ValueError:
        return None


def _num_or_0(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0
