"""Histogram observations as Prometheus counts them: every bucket whose bound is >= the value, the
sum and the count; field names cached per family and labels, the same as formatting them anew."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from shared import metrics_hash
from shared.metrics_hash import LATENCY_BUCKETS, TOKEN_BUCKETS


class Recorder:
    """Stands in for a Redis pipeline: sums what ``metrics_hash`` asks it to increment."""

    def __init__(self) -> None:
        self.fields: Counter[str] = Counter()
        self.floats: dict[str, float] = {}

    def hincrby(self, _key: str, field: str, amount: int = 1) -> None:
        self.fields[field] += amount

    def hincrbyfloat(self, _key: str, field: str, amount: float) -> None:
        self.floats[field] = self.floats.get(field, 0.0) + amount


def by_definition(name: str, values: list[float], buckets: tuple[float, ...], **labels: str) -> Counter[str]:
    want: Counter[str] = Counter()
    for value in values:
        for bound in (*buckets, math.inf):
            le = "+Inf" if math.isinf(bound) else repr(float(bound))
            if value <= bound:
                want[metrics_hash.series(f"{name}_bucket", **labels, le=le)] += 1
        want[metrics_hash.series(f"{name}_count", **labels)] += 1
    return want


@pytest.mark.parametrize("many", [False, True], ids=["observe", "observe_many"])
def test_buckets_by_definition(many: bool) -> None:
    rng = random.Random(3)
    values = [rng.choice((0.0, 0.001, 0.0025, 0.3, 60.0, 61.0)) for _ in range(40)]
    values += [rng.uniform(0, 70) for _ in range(200)]
    cases = [
        ("request_queue_time_seconds", values, LATENCY_BUCKETS, {"stage": "decode"}),
        ("request_prompt_tokens", [float(int(v * 300)) for v in values] + [1.0, 20000.0], TOKEN_BUCKETS, {}),
    ]
    for name, observed, buckets, labels in cases:
        got = Recorder()
        if many:
            metrics_hash.observe_many(got, "k", name, observed, buckets, **labels)
        else:
            for value in observed:
                metrics_hash.observe(got, "k", name, value, buckets, **labels)
        assert got.fields == by_definition(name, observed, buckets, **labels)
        assert got.floats[metrics_hash.series(f"{name}_sum", **labels)] == pytest.approx(sum(observed))


def test_nan_counts_but_falls_in_no_bucket() -> None:
    got = Recorder()
    metrics_hash.observe(got, "k", "e2e_request_latency_seconds", math.nan)
    assert dict(got.fields) == {"e2e_request_latency_seconds_count": 1}


def test_unknown_family_and_unsorted_buckets_are_refused() -> None:
    with pytest.raises(ValueError, match="not a histogram"):
        metrics_hash.observe(Recorder(), "k", "jobs_total", 1.0)
    with pytest.raises(ValueError, match="strictly increasing"):
        metrics_hash.observe(Recorder(), "k", "e2e_request_latency_seconds", 1.0, (1.0, 0.5))
