"""vlmq's Redis clients on a ``sentinel://`` URL, against a real master + replica + sentinel.

The sync client (workers) and the asyncio pool (gateway) reach the master the sentinels name and
follow a ``SENTINEL FAILOVER``: after it, their writes land on the promoted replica, and none go
on to the demoted master (which keeps accepting writes until the sentinels reconfigure it, and
then throws them away). ``WAIT`` must follow EXEC on the writing connection (``ReplicatedPipeline``):
queued inside the MULTI it answers at once without counting the transaction's writes.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis
import redis.asyncio as aioredis

from shared.config import CommonSettings
from shared.decode_task import DECODE_QUEUE, DECODE_TASK, make_celery_app
from shared.redis_clients import (
    MASTER_CHECK_S,
    NotReplicated,
    ReplicatedPipeline,
    SentinelOptions,
    async_pool,
    master_address,
    parse_sentinel_url,
    sync_client,
)
from tests.support.sentinel import MASTER_NAME, Node, SentinelCluster

OPTIONS = SentinelOptions(MASTER_NAME)


def test_sentinel_urls_are_parsed_like_celery_does() -> None:
    parsed = parse_sentinel_url("sentinel://:s3cret@h1:26379/2;sentinel://h2:26380/2")
    assert parsed is not None
    assert parsed.sentinels == [("h1", 26379), ("h2", 26380)]
    assert (parsed.db, parsed.password, parsed.username) == (2, "s3cret", None)
    assert parse_sentinel_url("sentinel://h1") is not None
    assert parse_sentinel_url("sentinel://h1").sentinels == [("h1", 26379)]  # type: ignore[union-attr]
    for plain in ("redis://127.0.0.1:6379/0", "rediss://h:6380", "unix:///tmp/redis.sock"):
        assert parse_sentinel_url(plain) is None


def test_celery_gets_the_sentinel_transport() -> None:
    url = "sentinel://127.0.0.1:1;sentinel://127.0.0.1:2"
    settings = CommonSettings(redis_url=url, redis_sentinel_master="m1", redis_sentinel_password="pw")
    options = make_celery_app(settings).conf.broker_transport_options
    assert options["master_name"] == "m1"
    assert options["sentinel_kwargs"] == {"password": "pw"}
    plain = make_celery_app(CommonSettings(redis_url="redis://127.0.0.1:1/0")).conf.broker_transport_options
    assert "master_name" not in plain


def test_the_sync_client_follows_a_failover(cluster: SentinelCluster) -> None:
    client = sync_client(cluster.url, sentinel=OPTIONS)
    old = cluster.master()
    client.set("before", 1)
    assert old.client().get("before") == b"1"
    took = cluster.failover()
    new = cluster.master()
    time.sleep(MASTER_CHECK_S + 0.1)  # the pool re-asks the sentinels at most this often
    client.set("after", 1)
    assert new.port != old.port and new.client().get("after") == b"1"
    assert master_address(cluster.url, OPTIONS) == f"127.0.0.1:{new.port}"
    assert took < 15


async def test_the_async_pool_follows_a_failover(cluster: SentinelCluster) -> None:
    client = aioredis.Redis(connection_pool=async_pool(cluster.url, 8, 5.0, OPTIONS))
    old = cluster.master()
    await asyncio.gather(*(client.set(f"before-{i}", i) for i in range(8)))  # several pooled connections
    await asyncio.to_thread(cluster.failover)
    new = cluster.master()
    await asyncio.sleep(MASTER_CHECK_S + 0.1)
    await asyncio.gather(*(client.set(f"after-{i}", i) for i in range(8)))
    assert new.port != old.port
    assert new.client().mget([f"after-{i}" for i in range(8)]) == [str(i).encode() for i in range(8)]
    await client.aclose()


def test_the_old_master_gets_no_writes_soon_after_the_switch(cluster: SentinelCluster) -> None:
    """The demoted master keeps accepting writes for ~10 s after ``SENTINEL FAILOVER`` (until the
    sentinels make it a replica, which discards them): from MASTER_CHECK_S after the switch on,
    every write of a busy client reaches the new master."""
    client = sync_client(cluster.url, sentinel=OPTIONS)
    client.rpush("log", "warm-up")  # the pool knows the old master
    old = cluster.master()
    cluster.failover()
    switched = time.monotonic()
    late = []
    for n in range(300):
        client.rpush("log", n)
        if time.monotonic() > switched + MASTER_CHECK_S + 0.1:
            late.append(str(n).encode())
        time.sleep(0.005)
    assert late and old.client().role()[0] == b"master"  # the old master is still writable
    assert set(late) <= set(cluster.master().client().lrange("log", 0, -1))
    assert not set(late) & set(old.client().lrange("log", 0, -1))


@contextmanager
def paused(node: Node) -> Iterator[None]:
    """A replica that acknowledges nothing (SIGSTOP) for the duration."""
    node.process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        node.process.send_signal(signal.SIGCONT)


async def test_wait_follows_exec_on_the_writing_connection(cluster: SentinelCluster) -> None:
    client = aioredis.Redis(connection_pool=async_pool(cluster.url, 4, 5.0, OPTIONS))
    async with ReplicatedPipeline(client, 1, 2000) as pipe:
        pipe.set("a", 1)
        assert await pipe.execute() == [True] and pipe.acked == 1
    (replica,) = cluster.replicas()
    with paused(replica):
        async with client.pipeline(transaction=True) as inside:  # why not WAIT inside the MULTI:
            inside.set("b", 1)
            inside.execute_command("WAIT", 1, 300)
            started = time.monotonic()
            await inside.execute()
            assert time.monotonic() - started < 0.2  # it never blocked: it cannot count "b"
        async with ReplicatedPipeline(client, 1, 300) as pipe:
            pipe.set("c", 1)
            with pytest.raises(NotReplicated, match="0 of 1"):
                await pipe.execute()
    await client.aclose()


def test_kombu_publishes_on_the_new_master_after_a_failover(cluster: SentinelCluster) -> None:
    settings = CommonSettings(
        redis_url=cluster.url, redis_sentinel_master=MASTER_NAME, key_prefix="vlmqtest-kombu"
    )
    app = make_celery_app(settings)
    app.send_task(DECODE_TASK, args=["job-1"], queue=DECODE_QUEUE)
    key = settings.keys.decode_queue()
    assert cluster.master().client().llen(key) == 1
    assert cluster.master().client().wait(1, 2000) == 1  # replication is asynchronous: job-1 on the replica
    cluster.failover()
    with app.connection_for_write() as conn:  # a fresh broker connection asks the sentinels again
        app.send_task(DECODE_TASK, args=["job-2"], queue=DECODE_QUEUE, connection=conn)
    assert cluster.master().client().llen(key) == 2
    app.close()


def test_a_client_without_sentinels_fails_fast() -> None:
    client = sync_client("sentinel://127.0.0.1:1", sentinel=OPTIONS, connect_timeout=0.5)
    started = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        client.ping()
    assert time.monotonic() - started < 5
