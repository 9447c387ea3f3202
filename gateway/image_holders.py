"""Whether every live inference worker keeps decoded images: only then may the gateway hand a job
over without pixels (``gateway.handoff``). A worker of a release without that cache fails such a
job ("decoded images are gone"), and any worker may get one (an entry moved off a busy worker's
stream, claimed from a dead one, or re-added by the sweeper), so during a rolling upgrade (or a
rollback) every job with images is decoded as before, until the last worker of the other release
is gone. Read from the heartbeats at most once a ``period_s`` per gateway process.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from gateway.metrics_redis import read_heartbeats
from shared.keys import Keys

KEEPS_IMAGES = "image_inputs"  # the heartbeat field a worker that keeps them publishes


@dataclass
class ImageHolders:
    period_s: float = 2.0
    _every_worker: bool = False
    _until: float = 0.0

    async def every_worker_keeps_images(self, redis: aioredis.Redis, keys: Keys, stale_s: float) -> bool:
        now = time.monotonic()
        if now >= self._until:
            beats: list[dict[str, Any]] = await read_heartbeats(redis, keys, stale_s)
            self._every_worker = bool(beats) and all(KEEPS_IMAGES in beat for beat in beats)
            self._until = now + self.period_s
        return self._every_worker
