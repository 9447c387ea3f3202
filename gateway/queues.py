"""The queues as operators and autoscalers see them, read in O(workers) Redis commands.

Inference work sits in the shared stream and in each worker's own stream (jobs routed for cache
affinity). An entry is *in flight* from its XADD until its XACK+XDEL (so XLEN counts waiting and
running jobs); it is *backlog* until a worker reads it (the group's ``lag``, Redis 7+): what
KEDA/HPA scale inference on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from shared.decode_task import QUEUES
from shared.keys import INFERENCE_GROUP, Keys
from shared.values import as_str


@dataclass
class StreamFigures:
    in_flight: int = 0  # XLEN: waiting + running
    backlog: int = 0  # not read by any worker yet


@dataclass
class QueueFigures:
    decode: dict[str, int] = field(default_factory=dict)  # tasks waiting per Celery queue
    inference: dict[str, StreamFigures] = field(default_factory=dict)  # "shared" or a worker id

    @property
    def inference_in_flight(self) -> int:
        return sum(s.in_flight for s in self.inference.values())

    @property
    def inference_backlog(self) -> int:
        return sum(s.backlog for s in self.inference.values())


async def read_queues(redis: aioredis.Redis, keys: Keys) -> QueueFigures:
    worker_ids = [as_str(w) for w in await redis.zrange(keys.workers(), 0, -1)]
    streams = {
        "shared": keys.inference_stream(),
        "batch": keys.batch_stream(),
        **{w: keys.worker_stream(w) for w in worker_ids},
    }
    async with redis.pipeline(transaction=False) as pipe:
        for queue in QUEUES:
            pipe.llen(keys.decode_queue(queue))
        for stream in streams.values():
            pipe.xlen(stream)
            pipe.xinfo_groups(stream)
        replies = await pipe.execute(raise_on_error=False)  # a stream not created yet: no groups
    figures = QueueFigures(decode={q: _int(n) for q, n in zip(QUEUES, replies, strict=False)})
    lengths = replies[len(QUEUES) :]
    for i, name in enumerate(streams):
        figures.inference[name] = StreamFigures(_int(lengths[2 * i]), _lag(lengths[2 * i + 1]))
    return figures


def _lag(groups: Any) -> int:
    if not isinstance(groups, list):
        return 0
    for group in groups:
        if as_str(group.get("name", "")) == INFERENCE_GROUP:
            return _int(group.get("lag"))
    return 0


def _int(value: Any) -> int:
    """A reply as an int; 0 for a missing stream's error or a null lag."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0
