"""Inference workers' heartbeats -> per-worker families, every one labelled ``worker`` (its id).

A heartbeat carries the engine's counts since the worker started (``EngineStats``): counters
here (a restarted worker starts again from 0, which ``rate()`` handles) and gauges for what goes
up and down. A heartbeat older than ``stale_s`` is a gone worker: its series vanish with it.
Every ``EngineStats`` field is mapped below or in ``worker_families`` (a test holds it so).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from shared.metrics_hash import BATCH_BUCKETS

# EngineStats field -> (family, help); names follow vLLM's where the meaning is the same
ENGINE_GAUGES = {
    "running": ("vlmq_num_requests_running", "Sequences in the engine's running batch"),
    "waiting": ("vlmq_num_requests_waiting", "Sequences in the engine waiting for a batch slot"),
    "max_batch": ("vlmq_engine_max_batch", "The engine's batch cap"),
    "failed_steps": ("vlmq_engine_failed_steps_in_a_row", "Steps in a row in which every sequence failed"),
}
ENGINE_COUNTERS = {  # CounterMetricFamily adds the _total
    "steps": ("vlmq_engine_steps", "Engine steps (prefill and decode)"),
    "prefill_steps": ("vlmq_engine_prefill_steps", "Engine steps that ran a prefill"),
    "decode_steps": ("vlmq_engine_decode_steps", "Engine steps that ran a decode batch"),
    "mixed_steps": ("vlmq_engine_mixed_steps", "Prefill steps whose forward also stepped running sequences"),
    "prompt_tokens": ("vlmq_prompt_tokens", "Prompt tokens of sequences that produced a first token"),
    "cached_tokens": ("vlmq_prompt_tokens_cached", "Prompt tokens served from the prefix or session cache"),
    "generated_tokens": ("vlmq_generation_tokens", "Tokens generated"),
    "submitted": ("vlmq_engine_requests_submitted", "Requests the engine accepted at submit"),
    "rejected": (
        "vlmq_engine_requests_rejected",
        "Requests the engine refused before running them (at submit, or their prompt on its thread)",
    ),
    "errors": ("vlmq_engine_errors", "Sequences failed by a step or by an error rendering their prompt"),
    "forward_cpu_s": ("vlmq_engine_forward_cpu_seconds", "Engine-thread CPU inside prefill and decode"),
    "step_cpu_s": ("vlmq_engine_step_cpu_seconds", "Engine-thread CPU of whole steps"),
    "prompt_cpu_s": ("vlmq_engine_prompt_cpu_seconds", "Engine-thread CPU rendering submitted prompts"),
}
# EngineStats {size: steps} field -> (histogram, help)
BATCH_HISTOGRAMS = {
    "batch_sizes": ("vlmq_engine_batch_size", "Sequences in the batch, per decode step"),
    "prefill_sizes": ("vlmq_engine_prefill_batch_size", "Sequences prefilled together, per prefill step"),
}
CACHE_COUNTERS = {  # CacheStats field(s) -> family
    "hits": ("vlmq_cache_hits", "Engine cache lookups that hit"),
    "lookups": ("vlmq_cache_lookups", "Engine cache lookups"),
    "evictions": ("vlmq_cache_evictions", "Engine cache entries evicted"),
}
CACHE_GAUGES = {
    "entries": ("vlmq_cache_entries", "Entries held per engine cache"),
    "bytes": ("vlmq_cache_bytes", "Bytes held per engine cache"),
    "capacity_bytes": ("vlmq_cache_capacity_bytes", "Byte budget per engine cache"),
}
MAPPED_ELSEWHERE = {"healthy", "finished", "caches", *BATCH_HISTOGRAMS}


def worker_families(beats: list[dict[str, Any]]) -> Iterator[Metric]:
    """Every per-worker family for the fresh heartbeats ``beats``."""
    alive = GaugeMetricFamily("vlmq_workers_alive", "Inference workers with a fresh heartbeat")
    alive.add_metric([], len(beats))
    yield alive
    yield from _worker_state(beats)
    yield from _engine(beats)
    yield from _caches(beats)
    yield _returned_to_decoding(beats)
    yield _finished(beats)
    for stat, (name, doc) in BATCH_HISTOGRAMS.items():
        yield size_histogram(beats, stat, name, doc)


def _worker_state(beats: list[dict[str, Any]]) -> Iterator[Metric]:
    healthy = GaugeMetricFamily("vlmq_worker_healthy", "1 when the worker reports healthy", labels=["worker"])
    inflight = GaugeMetricFamily("vlmq_worker_jobs_in_flight", "Jobs the worker holds", labels=["worker"])
    capacity = GaugeMetricFamily(
        "vlmq_worker_jobs_capacity", "Jobs the worker takes at most", labels=["worker"]
    )
    info = GaugeMetricFamily(
        "vlmq_worker_info",
        "Always 1: what the worker serves",
        labels=["worker", "model", "quantize", "device"],
    )
    for beat in beats:
        worker = _worker(beat)
        healthy.add_metric([worker], 1.0 if beat.get("healthy") else 0.0)
        inflight.add_metric([worker], _number(beat.get("inflight")))
        capacity.add_metric([worker], _number(beat.get("capacity")))
        info.add_metric([worker, *(str(beat.get(k, "")) for k in ("model", "quantize", "device"))], 1.0)
    yield from (healthy, inflight, capacity, info)


def _engine(beats: list[dict[str, Any]]) -> Iterator[Metric]:
    for stat, (name, doc) in ENGINE_GAUGES.items():
        gauge = GaugeMetricFamily(name, doc, labels=["worker"])
        for beat in beats:
            gauge.add_metric([_worker(beat)], _number(_stats(beat).get(stat)))
        yield gauge
    for stat, (name, doc) in ENGINE_COUNTERS.items():
        counter = CounterMetricFamily(name, doc, labels=["worker"])
        for beat in beats:
            counter.add_metric([_worker(beat)], _number(_stats(beat).get(stat)))
        yield counter


def _caches(beats: list[dict[str, Any]]) -> Iterator[Metric]:
    """Per engine cache, and the worker's decoded images (``image_input``): hits and lookups (hits +
    misses) as counters, so ratios are ``rate()``s."""
    labels = ["worker", "cache"]
    families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {
        **{k: CounterMetricFamily(n, d, labels=labels) for k, (n, d) in CACHE_COUNTERS.items()},
        **{k: GaugeMetricFamily(n, d, labels=labels) for k, (n, d) in CACHE_GAUGES.items()},
    }
    for beat in beats:
        caches = {**(_stats(beat).get("caches") or {}), "image_input": beat.get("image_inputs")}
        for cache, figures in caches.items():
            if not isinstance(figures, dict):
                continue
            values = {k: _number(figures.get(k)) for k in ("hits", "misses", "evictions", *CACHE_GAUGES)}
            values["lookups"] = values["hits"] + values.pop("misses")
            for stat, family in families.items():
                family.add_metric([_worker(beat), str(cache)], values[stat])
    yield from families.values()


def _returned_to_decoding(beats: list[dict[str, Any]]) -> Metric:
    returned = CounterMetricFamily(
        "vlmq_image_inputs_returned",
        "Jobs handed over without pixels whose pictures the worker did not hold (sent back to decoding)",
        labels=["worker"],
    )
    for beat in beats:
        figures = beat.get("image_inputs")
        if isinstance(figures, dict):
            returned.add_metric([_worker(beat)], _number(figures.get("returned")))
    return returned


def _finished(beats: list[dict[str, Any]]) -> Metric:
    family = CounterMetricFamily(
        "vlmq_engine_requests_finished",
        "Engine requests ended, by finish reason",
        labels=["worker", "reason"],
    )
    for beat in beats:
        for reason, count in sorted((_stats(beat).get("finished") or {}).items()):
            family.add_metric([_worker(beat), str(reason)], _number(count))
    return family


def size_histogram(beats: list[dict[str, Any]], stat: str, name: str, doc: str) -> Metric:
    """An engine ``{size: steps}`` count -> a histogram of the size per step, in fixed buckets
    (exact: sizes are whole numbers)."""
    family = HistogramMetricFamily(name, doc, labels=["worker"])
    for beat in beats:
        try:
            steps = [(int(k), _number(v)) for k, v in (_stats(beat).get(stat) or {}).items()]
        except (TypeError, ValueError, AttributeError):
            steps = []
        buckets = [(str(float(b)), sum(n for size, n in steps if size <= b)) for b in BATCH_BUCKETS]
        buckets.append(("+Inf", sum(n for _, n in steps)))
        family.add_metric([_worker(beat)], buckets, sum(size * n for size, n in steps))
    return family


def _stats(beat: dict[str, Any]) -> dict[str, Any]:
    engine = beat.get("engine")
    return engine if isinstance(engine, dict) else {}


def _worker(beat: dict[str, Any]) -> str:
    return str(beat.get("worker_id", "?"))


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0
