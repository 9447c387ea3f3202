"""How every vlmq process connects to Redis: one place for timeouts, the retry rule and Sentinel.

After a Redis restart every pooled connection is dead; without a retry the first command on
each fails. Each command is therefore retried once, on a fresh connection, after a connection
error (never after a timeout: a slow command is not sent twice; nor after a connect that timed
out, which the callers' own error handling takes, as for a Redis that is down). A Redis that
stays down still fails fast, and the gateway answers 503.

Sentinel (``VLMQ_REDIS_URL=sentinel://h1:26379;sentinel://h2:26379``, Celery's form): a fresh
connection asks the sentinels for the current master, so the retry above reaches a promoted
replica. Connections to a demoted master do not fail by themselves: after ``SENTINEL FAILOVER``
the old master keeps accepting writes until the sentinels reconfigure it as a replica (about
10 s later), and whatever it accepted meanwhile is discarded when it resyncs. So the pools also
re-ask the sentinels at most every ``MASTER_CHECK_S`` and drop connections to a master that is
no longer the one the sentinels name.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio as aioredis
import redis.asyncio.sentinel as aiosentinel
import redis.sentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

HEALTH_CHECK_S = 30
# redis-py's Retry also retries timeouts by default; ours retry a command after a connection error only
RETRY_ON = (redis.ConnectionError,)
MASTER_CHECK_S = 0.5  # how stale a pool's idea of the master may get
SENTINEL_TIMEOUT_S = 2.0  # one unreachable sentinel must not hold a connect up for long


@dataclass(frozen=True)
class SentinelOptions:
    """What a ``sentinel://`` URL cannot say: the monitored master's name, the sentinels' password."""

    master: str = "mymaster"
    password: str | None = None  # the sentinels' own (sentinel.conf requirepass); the URL's is Redis's


@dataclass(frozen=True)
class SentinelURL:
    """A parsed ``sentinel://[:pw@]h1:26379[/db];sentinel://h2:26379[/db]``: like kombu, the
    first part's credentials and db apply (they are the data nodes', not the sentinels')."""

    sentinels: list[tuple[str, int]]
    db: int
    username: str | None
    password: str | None


def parse_sentinel_url(url: str) -> SentinelURL | None:
    """The sentinels of a ``sentinel://`` URL; None for any other URL (redis://, rediss://, unix://)."""
    parts = [urlsplit(p.strip()) for p in url.split(";") if p.strip()]
    if not parts or any(p.scheme != "sentinel" for p in parts):
        return None
    first = parts[0]
    db = first.path.strip("/")
    return SentinelURL(
        sentinels=[(p.hostname or "127.0.0.1", p.port or 26379) for p in parts],
        db=int(db) if db else 0,
        username=unquote(first.username) if first.username else None,
        password=unquote(first.password) if first.password else None,
    )


def master_address(url: str, options: SentinelOptions, timeout_s: float = SENTINEL_TIMEOUT_S) -> str:
    """``host:port`` of the master the sentinels of a ``sentinel://`` URL name now."""
    parsed = parse_sentinel_url(url)
    if parsed is None:
        raise ValueError(f"not a sentinel:// URL: {url}")
    kwargs = _sentinel_kwargs(options, Retry(NoBackoff(), 1), timeout_s)
    manager = redis.sentinel.Sentinel(parsed.sentinels, sentinel_kwargs=kwargs)
    host, port = manager.discover_master(options.master)
    return f"{host}:{port}"


def sync_client(
    url: str,
    socket_timeout: float = 10.0,
    sentinel: SentinelOptions | None = None,
    connect_timeout: float = 5.0,
) -> redis.Redis:
    """A client for worker processes (sync): retries a command once after a connection error."""
    options: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": connect_timeout,
        "health_check_interval": HEALTH_CHECK_S,
        "retry": Retry(NoBackoff(), 1, supported_errors=RETRY_ON),
        "retry_on_error": list(RETRY_ON),
    }
    parsed = parse_sentinel_url(url)
    if parsed is None:
        return redis.Redis.from_url(url, **options)
    sentinel = sentinel or SentinelOptions()
    manager = redis.sentinel.Sentinel(
        parsed.sentinels, sentinel_kwargs=_sentinel_kwargs(sentinel, Retry(NoBackoff(), 1), connect_timeout)
    )
    options.update(_master_auth(parsed))
    return manager.master_for(sentinel.master, connection_pool_class=_SyncFollowingPool, **options)


def async_pool(
    url: str, size: int, socket_timeout: float, sentinel: SentinelOptions | None = None
) -> aioredis.BlockingConnectionPool:
    """A bounded asyncio pool (the gateway's): short timeouts, one retry after a connection error."""
    options: dict[str, Any] = {
        "max_connections": size,
        "timeout": 5,
        "socket_connect_timeout": 2.0,
        "socket_timeout": socket_timeout,
        "health_check_interval": HEALTH_CHECK_S,
        "retry": AsyncRetry(NoBackoff(), 1, supported_errors=RETRY_ON),
        "retry_on_error": list(RETRY_ON),
    }
    parsed = parse_sentinel_url(url)
    if parsed is None:
        return aioredis.BlockingConnectionPool.from_url(url, **options)
    sentinel = sentinel or SentinelOptions()
    manager = aiosentinel.Sentinel(
        parsed.sentinels, sentinel_kwargs=_sentinel_kwargs(sentinel, AsyncRetry(NoBackoff(), 1))
    )
    return _AsyncFollowingPool(sentinel.master, manager, is_master=True, **options, **_master_auth(parsed))


def _sentinel_kwargs(
    options: SentinelOptions, retry: Retry | AsyncRetry, timeout_s: float = SENTINEL_TIMEOUT_S
) -> dict[str, Any]:
    """Short timeouts and one immediate retry (redis-py's default backs off for seconds): a dead
    sentinel must not delay asking the next one."""
    timeout_s = min(timeout_s, SENTINEL_TIMEOUT_S)
    kwargs: dict[str, Any] = {
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "retry": retry,
    }
    if options.password:
        kwargs["password"] = options.password
    return kwargs


def _master_auth(parsed: SentinelURL) -> dict[str, Any]:
    auth: dict[str, Any] = {"db": parsed.db}
    if parsed.username:
        auth["username"] = parsed.username
    if parsed.password:
        auth["password"] = parsed.password
    return auth


class _SyncFollowingPool(redis.sentinel.SentinelConnectionPool):
    """Re-asks the sentinels at most every MASTER_CHECK_S; a connection handed out that still
    points at another master is reconnected (to the one the sentinels name)."""

    _next_check = 0.0

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        now = time.monotonic()
        if now >= self._next_check and self.master_address is not None:
            self._next_check = now + MASTER_CHECK_S
            with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):  # keep the master we know
                self.get_master_address()
        connection = super().get_connection(*args, **kwargs)
        if _stale(self.master_address, connection):
            try:
                connection.disconnect()
                connection.connect()
            except BaseException:
                self.release(connection)
                raise
        return connection


class _AsyncFollowingPool(aiosentinel.SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """The gateway's bounded pool (waits for a free connection) on the sentinels' master, re-asked
    like ``_SyncFollowingPool``; tasks that arrive while the sentinels are being asked wait for the
    answer instead of taking a connection to the old master meanwhile."""

    _next_check = 0.0
    _check_lock: asyncio.Lock | None = None

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        if time.monotonic() >= self._next_check and self.master_address is not None:
            await self._recheck_master()
        connection = await super().get_connection(*args, **kwargs)
        if _stale(self.master_address, connection):
            try:
                await connection.disconnect()
                await connection.connect()
            except BaseException:
                await self.release(connection)
                raise
        return connection

    async def _recheck_master(self) -> None:
        self._check_lock = self._check_lock or asyncio.Lock()
        async with self._check_lock:
            if time.monotonic() < self._next_check:
                return  # another task asked while this one waited
            with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
                await self.get_master_address()
            self._next_check = time.monotonic() + MASTER_CHECK_S


def _stale(master: tuple[str, int] | None, connection: Any) -> bool:
    """A connected connection to another server than the current master."""
    return master is not None and connection.is_connected and (connection.host, connection.port) != master


class NotReplicated(redis.RedisError):
    """Fewer replicas than asked for acknowledged a write within the wait."""


class ReplicatedPipeline(aioredis.client.Pipeline):
    """A MULTI/EXEC pipeline followed by ``WAIT replicas timeout_ms`` on the connection that ran
    EXEC; ``execute`` raises ``NotReplicated`` when fewer replicas acknowledged the writes.

    Why not ``WAIT`` queued inside the MULTI: in a transaction WAIT never blocks and answers
    before EXEC has propagated anything, so it counts older writes; and WAIT on another pooled
    connection counts only that connection's writes. It must follow EXEC on the same connection.
    A connection error during the WAIT counts as not acknowledged (the MULTI is not re-sent)."""

    def __init__(self, client: aioredis.Redis, replicas: int, timeout_ms: int) -> None:
        super().__init__(client.connection_pool, client.response_callbacks, True, None)
        self.replicas = replicas
        self.timeout_ms = timeout_ms
        self.acked: int | None = None  # None: no transaction ran (nothing to wait for)

    async def _execute_transaction(self, connection: Any, commands: Any, raise_on_error: Any) -> Any:
        replies = await super()._execute_transaction(connection, commands, raise_on_error)
        try:
            await connection.send_command("WAIT", self.replicas, self.timeout_ms)
            self.acked = int(await connection.read_response(timeout=self.timeout_ms / 1000 + 5))
        except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):  # gone, or now a replica
            self.acked = 0
        return replies

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        replies = await super().execute(raise_on_error)
        if self.acked is not None and self.acked < self.replicas:
            raise NotReplicated(
                f"{self.acked} of {self.replicas} Redis replicas acknowledged the write "
                f"within {self.timeout_ms} ms"
            )
        return replies
