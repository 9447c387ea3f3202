"""What the gateway holds for its lifetime (created in the app lifespan)."""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from gateway.decode_queue import DecodeQueue
from gateway.metrics import GatewayMetrics
from shared.config import GatewaySettings
from shared.jobs import FINISH_LUA, SET_STATUS_LUA
from shared.keys import Keys


@dataclass
class GatewayState:
    settings: GatewaySettings
    redis: aioredis.Redis
    decode: DecodeQueue
    metrics: GatewayMetrics
    finish: AsyncScript
    set_status: AsyncScript

    @property
    def keys(self) -> Keys:
        return self.settings.keys

    @classmethod
    def create(cls, settings: GatewaySettings) -> GatewayState:
        # Short socket timeouts: a Redis outage becomes a fast 503, not a hung request.
        # Blocking pool: every open stream holds a connection during XREAD BLOCK; past the cap
        # a request waits a little for one instead of failing at once.
        pool = aioredis.BlockingConnectionPool.from_url(
            settings.redis_url,
            max_connections=512,
            timeout=5,
            socket_connect_timeout=2.0,
            socket_timeout=10.0,
            health_check_interval=30,
        )
        client = aioredis.Redis(connection_pool=pool)
        return cls(
            settings=settings,
            redis=client,
            decode=DecodeQueue(settings),
            metrics=GatewayMetrics(settings.worker_stale_s),
            finish=client.register_script(FINISH_LUA),
            set_status=client.register_script(SET_STATUS_LUA),
        )

    async def close(self) -> None:
        self.decode.close()
        await self.redis.aclose()
