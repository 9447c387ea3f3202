"""Admission before work (architecture contract): refuse a job while the queues are full.

Depth = accepted jobs not yet terminal (the active-jobs set: queued, decoding, waiting or
generating). ``ADMIT_LUA`` checks it and adds the new job in one step, so gateways admitting
at the same moment never pass the cap together. Checked before any byte is stored or any task
enqueued (a gateway that dies after admitting leaves a member without a record, which the
sweeper removes). Overload -> 429 with ``Retry-After``:
the seconds the workers need to bring the depth back under the cap, at their recent completion
rate (``jobs_total`` in the workers' metrics hash, sampled here over the last minute).
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Any

import redis.asyncio as aioredis

from gateway.errors import APIError
from shared.jobs import ADMIT_LUA
from shared.keys import Keys
from shared.metrics_hash import parse_series
from shared.values import as_str

RATE_WINDOW_S = 60.0
DEFAULT_RATE = 1.0  # jobs/s assumed until two samples exist
MAX_RETRY_AFTER_S = 300


class Throughput:
    """Jobs finished per second, cluster-wide, from samples of the workers' ``jobs_total``."""

    def __init__(self) -> None:
        self.samples: deque[tuple[float, float]] = deque()

    async def rate(self, redis: aioredis.Redis, keys: Keys) -> float:
        now, total = time.monotonic(), await jobs_total(redis, keys)
        self.samples.append((now, total))
        while len(self.samples) > 2 and self.samples[0][0] < now - RATE_WINDOW_S:
            self.samples.popleft()
        (t0, n0), (t1, n1) = self.samples[0], self.samples[-1]
        if t1 - t0 < 1.0 or n1 <= n0:
            return DEFAULT_RATE
        return (n1 - n0) / (t1 - t0)


async def jobs_total(redis: aioredis.Redis, keys: Keys) -> float:
    raw: Any = await redis.hgetall(keys.metrics_counters())
    total = 0.0
    for name, value in raw.items():
        parsed = parse_series(as_str(name))
        if parsed is not None and parsed[0] == "jobs_total":
            total += float(as_str(value))
    return total


def queue_admission(pipe: Any, keys: Keys, job_id: str, max_depth: int, hold_s: float = 0.0) -> None:
    """Queue ``ADMIT_LUA`` on ``pipe`` (a pipeline, so it can share a round trip): it reserves the
    job's place in the active set unless the set is at ``max_depth``. Its reply: -1 when admitted,
    else the depth (``refuse_when_full``). ``hold_s`` > 0 (an interactive job): it holds batch
    work until it ends, at most that long."""
    now = time.time()
    hold_until = repr(now + hold_s) if hold_s > 0 else ""
    job_key, sets = keys.job(job_id), (keys.active_jobs(), keys.interactive_jobs())
    pipe.eval(ADMIT_LUA, 2, *sets, max_depth, now, job_key, hold_until)


async def refuse_when_full(
    redis: aioredis.Redis, keys: Keys, reply: Any, max_depth: int, throughput: Throughput
) -> None:
    """429 (with Retry-After) when ``ADMIT_LUA``'s reply says the queues were full."""
    depth = int(reply)
    if depth < 0:
        return
    rate = await throughput.rate(redis, keys)
    wait = min(MAX_RETRY_AFTER_S, max(1, math.ceil((depth - max_depth + 1) / rate)))
    raise APIError(
        429,
        f"server busy: {depth} jobs queued (limit {max_depth}); retry in {wait} s",
        code="queue_full",
        headers={"Retry-After": str(wait)},
    )
