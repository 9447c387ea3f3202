"""Worker metrics published into one Redis hash (``Keys.metrics_counters``), Prometheus-shaped.

Field names are Prometheus series names with labels, values are numbers, e.g.::

    jobs_total{outcome="done"}                                       -> 42
    request_queue_time_seconds_bucket{le="0.05",stage="decode"}      -> 17   (cumulative, like Prometheus)
    request_queue_time_seconds_sum{stage="decode"}                   -> 1.93
    request_queue_time_seconds_count{stage="decode"}                 -> 40

Workers write with ``inc``/``observe`` (HINCRBY/HINCRBYFLOAT on any sync or async pipeline);
the gateway's ``/metrics`` reads the hash with ``parse_series`` and exposes each family of
``FAMILIES`` with a ``vlmq_`` prefix. Many processes may write the same hash: increments add up
cluster-wide, so no series here carries a worker label (worker ids come and go; the hash stays).
"""

from __future__ import annotations

import bisect
import functools
import math
import re
from dataclasses import dataclass
from typing import Any

# Seconds buckets for stage latencies / TTFT; inter-token latency uses the low end.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000)


@dataclass(frozen=True)
class Family:
    kind: str  # counter (name ends in _total) or histogram
    help: str


# Every family the hash may hold; ``inc``/``observe`` refuse other names, /metrics shows only these.
# Names follow vLLM's (``vllm:time_to_first_token_seconds`` -> ``vlmq_time_to_first_token_seconds``)
# where the meaning is the same; vLLM's "decode" is token generation, vlmq's image decoding is
# ``request_image_decode_time_seconds``. Durations are observed for jobs that end done.
FAMILIES: dict[str, Family] = {
    "jobs_total": Family("counter", "Jobs that reached a terminal state, by outcome"),
    "sweeper_actions_total": Family("counter", "Stuck or overdue jobs the sweeper acted on, by action"),
    "decode_claimed_jobs_total": Family(
        "counter", "Decode jobs a busy task took from its queue after its own, without a task of their own"
    ),
    "process_restarts_total": Family("counter", "Processes `make up` restarted, by process"),
    "time_to_first_token_seconds": Family("histogram", "Accepted -> first token"),
    "e2e_request_latency_seconds": Family("histogram", "Accepted -> done"),
    "inter_token_latency_seconds": Family(
        "histogram", "Between two tokens of a job: two token writes' gap over the later one's tokens"
    ),
    "request_queue_time_seconds": Family(
        "histogram",
        "Waiting per stage: decode (accepted -> decode started), inference (tensor ready -> in a batch)",
    ),
    "request_image_decode_time_seconds": Family("histogram", "Image bytes -> pixel tensor (decode worker)"),
    "request_vision_time_seconds": Family("histogram", "Vision encoder (0 on an image-cache hit)"),
    "request_prefill_time_seconds": Family("histogram", "Prompt prefill"),
    "request_decode_time_seconds": Family("histogram", "First token -> last token (token generation)"),
    "request_prompt_tokens": Family("histogram", "Prompt tokens per job"),
    "request_generation_tokens": Family("histogram", "Generated tokens per job"),
}

_SERIES = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(\{(?P<labels>.*)\})?$")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?')


def series(name: str, **labels: object) -> str:
    """``series("jobs_total", outcome="done")`` -> ``jobs_total{outcome="done"}``."""
    if not labels:
        return name
    inner = ",".join(f'{k}="{_escape(str(v))}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def inc(pipe: Any, key: str, name: str, amount: float = 1, **labels: object) -> None:
    """Add ``amount`` to a counter (HINCRBY for ints, HINCRBYFLOAT otherwise)."""
    _known(name, "counter")
    field = series(name, **labels)
    if isinstance(amount, int):
        pipe.hincrby(key, field, amount)
    else:
        pipe.hincrbyfloat(key, field, amount)


def observe(
    pipe: Any,
    key: str,
    name: str,
    value: float,
    buckets: tuple[float, ...] = LATENCY_BUCKETS,
    **labels: object,
) -> None:
    """One histogram observation: cumulative ``_bucket`` counts, ``_sum`` and ``_count``."""
    fields = _histogram_fields(name, _label_items(labels), buckets)
    if value == value:  # NaN falls in no bucket
        for field in fields.buckets[bisect.bisect_left(fields.bounds, value) :]:
            pipe.hincrby(key, field, 1)
    pipe.hincrbyfloat(key, fields.sum, float(value))
    pipe.hincrby(key, fields.count, 1)


def observe_many(
    pipe: Any,
    key: str,
    name: str,
    values: list[float],
    buckets: tuple[float, ...] = LATENCY_BUCKETS,
    **labels: object,
) -> None:
    """Many observations in one go (bucket counts summed here: at most len(buckets) + 3 commands)."""
    fields = _histogram_fields(name, _label_items(labels), buckets)
    if not values:
        return
    for bound, field in zip(fields.bounds, fields.buckets, strict=True):
        if count := sum(1 for v in values if v <= bound):
            pipe.hincrby(key, field, count)
    pipe.hincrbyfloat(key, fields.sum, float(sum(values)))
    pipe.hincrby(key, fields.count, len(values))


@dataclass(frozen=True)
class _HistogramFields:
    bounds: tuple[float, ...]  # the buckets' upper bounds, +Inf last
    buckets: tuple[str, ...]  # their fields, in the same order
    sum: str
    count: str


def _label_items(labels: dict[str, object]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, str(v)) for k, v in labels.items()))


@functools.lru_cache(maxsize=256)
def _histogram_fields(
    name: str, labels: tuple[tuple[str, str], ...], buckets: tuple[float, ...]
) -> _HistogramFields:
    """A histogram's field names, built once per (family, labels, buckets): a done job makes ~150
    increments, and formatting each field anew was ~9 % of the inference worker's CPU at 32 clients."""
    _known(name, "histogram")
    if list(buckets) != sorted(set(buckets)):
        raise ValueError(f"{name}: bucket bounds must be strictly increasing, got {buckets}")
    bounds = (*buckets, math.inf)
    named = dict(labels)
    return _HistogramFields(
        bounds,
        tuple(series(f"{name}_bucket", **named, le=_le(bound)) for bound in bounds),
        series(f"{name}_sum", **named),
        series(f"{name}_count", **named),
    )


def parse_series(field: str) -> tuple[str, dict[str, str]] | None:
    """``name{a="b"}`` -> (name, {a: b}); anything else is sanitised into a bare name."""
    match = _SERIES.match(field)
    if match is None:
        name = re.sub(r"[^A-Za-z0-9_]", "_", field)
        return (name, {}) if name and not name[0].isdigit() else None
    labels = {k: _unescape(v) for k, v in _LABEL.findall(match.group("labels") or "")}
    return match.group("name"), labels


def _known(name: str, kind: str) -> None:
    family = FAMILIES.get(name)
    if family is None or family.kind != kind:
        raise ValueError(f"{name!r} is not a {kind} of shared.metrics_hash.FAMILIES")


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _unescape(value: str) -> str:
    return value.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
