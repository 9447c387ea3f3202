"""What the gateway holds for its lifetime (created in the app lifespan)."""

from __future__ import annotations

from dataclasses import dataclass, field

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from gateway.admission import Throughput
from gateway.decode_queue import DecodeQueue
from gateway.errors import APIError
from gateway.metrics import GatewayMetrics
from shared.config import GatewaySettings
from shared.jobs import FINISH_LUA, SET_STATUS_LUA
from shared.keys import Keys

API_CONNECTIONS = 128


def _pool(settings: GatewaySettings, size: int, socket_timeout: float) -> aioredis.BlockingConnectionPool:
    # Short timeouts: a Redis outage becomes a fast 503, not a hung request.
    return aioredis.BlockingConnectionPool.from_url(
        settings.redis_url,
        max_connections=size,
        timeout=5,
        socket_connect_timeout=2.0,
        socket_timeout=socket_timeout,
        health_check_interval=30,
    )


@dataclass
class GatewayState:
    """Two Redis clients on separate pools: ``redis`` for API calls, ``streams`` for SSE/WS readers
    (each holds a connection during XREAD BLOCK), so open streams never starve POST or /readyz."""

    settings: GatewaySettings
    redis: aioredis.Redis
    streams: aioredis.Redis
    decode: DecodeQueue
    metrics: GatewayMetrics
    finish: AsyncScript
    set_status: AsyncScript
    throughput: Throughput = field(default_factory=Throughput)
    open_streams: int = 0

    @property
    def keys(self) -> Keys:
        return self.settings.keys

    @classmethod
    def create(cls, settings: GatewaySettings) -> GatewayState:
        client = aioredis.Redis(connection_pool=_pool(settings, API_CONNECTIONS, 10.0))
        streams = aioredis.Redis(connection_pool=_pool(settings, settings.stream_connections, 10.0))
        return cls(
            settings=settings,
            redis=client,
            streams=streams,
            decode=DecodeQueue(settings),
            metrics=GatewayMetrics(settings.worker_stale_s),
            finish=client.register_script(FINISH_LUA),
            set_status=client.register_script(SET_STATUS_LUA),
        )

    def check_stream_slot(self) -> None:
        """503 when every stream connection is taken (checked before a stream response starts)."""
        if self.open_streams >= self.settings.stream_connections:
            raise APIError(
                503,
                f"too many open streams ({self.open_streams}); poll GET /v1/jobs/{{id}} or retry shortly",
                code="streams_full",
                headers={"Retry-After": "1"},
            )

    async def close(self) -> None:
        self.decode.close()
        await self.streams.aclose()
        await self.redis.aclose()
