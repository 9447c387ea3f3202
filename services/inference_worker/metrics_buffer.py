"""Metric increments of finished jobs, summed in memory and written at most once a ``period_s``.

``shared.metrics_hash`` writes a histogram observation as one HINCRBY per cumulative bucket: a done
job's stage times, token counts and inter-token gaps are ~150 commands, which cost this process
(encoding) and Redis (running them) more than the job's own writes. ``MetricsBuffer`` stands in
for the pipeline ``metrics_hash`` writes to: it adds the increments up per field, and ``flush``
writes one HINCRBY / HINCRBYFLOAT per changed field. Used by the writer thread only. A crash loses
at most ``period_s`` of metrics, never a job's state (``jobs_total`` stays immediate)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import redis


class MetricsBuffer:
    def __init__(self, period_s: float = 1.0) -> None:
        self.period_s = period_s
        self._ints: Counter[tuple[str, str]] = Counter()
        self._floats: dict[tuple[str, str], float] = {}
        self._last = time.monotonic()

    # the two pipeline methods ``metrics_hash`` calls
    def hincrby(self, key: str, field: str, amount: int = 1) -> None:
        self._ints[(key, field)] += amount

    def hincrbyfloat(self, key: str, field: str, amount: float) -> None:
        self._floats[(key, field)] = self._floats.get((key, field), 0.0) + amount

    def due(self) -> bool:
        return bool(self._ints or self._floats) and time.monotonic() - self._last >= self.period_s

    def flush(self, client: Any) -> None:
        """Write what was summed (one round trip); on a Redis error it is kept for the next try."""
        ints, floats = self._ints, self._floats
        self._ints, self._floats, self._last = Counter(), {}, time.monotonic()
        pipe = client.pipeline(transaction=False)
        for (key, field), amount in ints.items():
            pipe.hincrby(key, field, amount)
        for (key, field), value in floats.items():
            pipe.hincrbyfloat(key, field, value)
        try:
            pipe.execute()
        except redis.RedisError:
            self._ints.update(ints)
            for k, v in floats.items():
                self.hincrbyfloat(*k, v)
            raise
