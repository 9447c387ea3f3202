"""A real gateway (uvicorn subprocess, ``gateway.app:create_app --factory``) on the test Redis.

No workers run here: tests play the workers' part by writing job state and events into
Redis through the shared Lua scripts (``tests/gateway/workerside.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import redis

from tests.support.stack import ServiceStack, running

# Small limits so size tests stay fast; the gateway reads them from its environment.
MAX_IMAGE_BYTES = 300_000
MAX_IMAGE_PIXELS = 2_000_000
GATEWAY_ENV = {
    "VLMQ_MAX_IMAGE_BYTES": str(MAX_IMAGE_BYTES),
    "VLMQ_MAX_IMAGE_PIXELS": str(MAX_IMAGE_PIXELS),
    "VLMQ_MAX_PROMPT_CHARS": "2000",
    "VLMQ_MAX_TOKENS_LIMIT": "256",
    "VLMQ_WORKER_STALE_S": "3",
    "VLMQ_MAX_QUEUE_DEPTH": "100000",  # no decode worker consumes here: the queue only grows
}


def gateway_only(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory, name: str
) -> Iterator[ServiceStack]:
    """A gateway on its own key prefix, with this suite's limits, for as long as the fixture lives."""
    stack = ServiceStack(
        redis_url, tmp_path_factory.mktemp(name), extra_env=GATEWAY_ENV, components=("gateway",)
    )
    with running(stack, timeout_s=60):
        yield stack


@pytest.fixture(scope="session")
def gateway(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceStack]:
    yield from gateway_only(redis_url, tmp_path_factory, "gateway")


@pytest.fixture
async def client(gateway: ServiceStack) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=30) as c:
        yield c


@pytest.fixture
def r(gateway: ServiceStack) -> redis.Redis:
    return gateway.redis


def stored_keys(stack: ServiceStack) -> set[bytes]:
    """Every key of the gateway's key space (jobs, images, sessions, Celery queue)."""
    return set(stack.redis.scan_iter(match=f"{stack.key_prefix}:*", count=1000))
