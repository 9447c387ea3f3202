"""How every vlmq process connects to Redis: one place for timeouts and the retry rule.

After a Redis restart every pooled connection is dead; without a retry the first command on
each fails. Each command is therefore retried once, on a fresh connection, after a connection
error (never after a timeout: a slow command is not sent twice). A Redis that stays down still
fails fast, and the gateway answers 503.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

HEALTH_CHECK_S = 30


def sync_client(url: str, socket_timeout: float = 10.0) -> redis.Redis:
    """A client for worker processes (sync): retries a command once after a connection error."""
    return redis.Redis.from_url(
        url,
        socket_timeout=socket_timeout,
        socket_connect_timeout=5.0,
        health_check_interval=HEALTH_CHECK_S,
        retry=Retry(NoBackoff(), 1),
        retry_on_error=[redis.ConnectionError],
    )


def async_pool(url: str, size: int, socket_timeout: float) -> aioredis.BlockingConnectionPool:
    """A bounded asyncio pool (the gateway's): short timeouts, one retry after a connection error."""
    options: dict[str, Any] = {
        "max_connections": size,
        "timeout": 5,
        "socket_connect_timeout": 2.0,
        "socket_timeout": socket_timeout,
        "health_check_interval": HEALTH_CHECK_S,
        "retry": AsyncRetry(NoBackoff(), 1),
        "retry_on_error": [redis.ConnectionError],
    }
    return aioredis.BlockingConnectionPool.from_url(url, **options)
