"""What the gateway holds for its lifetime (created in the app lifespan)."""

from __future__ import annotations

from dataclasses import dataclass, field

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from gateway.admission import Throughput
from gateway.keyring import Keyring
from gateway.metrics import GatewayMetrics
from gateway.stream_slots import StreamSlots
from shared.config import GatewaySettings
from shared.decode_task import DecodeTasks
from shared.jobs import FINISH_LUA, SET_STATUS_LUA
from shared.keys import Keys
from shared.redis_clients import async_pool

API_CONNECTIONS = 128


@dataclass
class GatewayState:
    """Two Redis clients on separate pools: ``redis`` for API calls, ``streams`` for SSE/WS readers
    (each holds a connection during XREAD BLOCK), so open streams never starve POST or /readyz."""

    settings: GatewaySettings
    redis: aioredis.Redis
    streams: aioredis.Redis
    decode: DecodeTasks
    metrics: GatewayMetrics
    finish: AsyncScript
    set_status: AsyncScript
    stream_slots: StreamSlots
    keyring: Keyring
    throughput: Throughput = field(default_factory=Throughput)

    @property
    def keys(self) -> Keys:
        return self.settings.keys

    @classmethod
    def create(cls, settings: GatewaySettings) -> GatewayState:
        url, sentinel = settings.redis_url, settings.sentinel
        client = aioredis.Redis(connection_pool=async_pool(url, API_CONNECTIONS, 10.0, sentinel))
        streams = aioredis.Redis(connection_pool=async_pool(url, settings.stream_connections, 10.0, sentinel))
        return cls(
            settings=settings,
            redis=client,
            streams=streams,
            decode=DecodeTasks(settings),
            metrics=GatewayMetrics(settings.worker_stale_s),
            finish=client.register_script(FINISH_LUA),
            set_status=client.register_script(SET_STATUS_LUA),
            stream_slots=StreamSlots(settings.stream_connections),
            keyring=Keyring(settings.api_keys, settings.api_keys_file),
        )

    async def close(self) -> None:
        self.decode.close()
        await self.streams.aclose()
        await self.redis.aclose()
