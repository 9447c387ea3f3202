"""Our Redis clients parse replies in C (hiredis): a redis-py or hiredis upgrade that silently falls
back to the pure-Python parser costs every process ~60 us of CPU per pipeline or hash read. And they
send a command again after a connection error only, never after a timeout (a slow write runs once)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import redis.asyncio as aioredis
import redis.utils

from shared.redis_clients import async_pool, sync_client


def test_sync_client_parses_with_hiredis(redis_url: str) -> None:
    assert redis.utils.HIREDIS_AVAILABLE, "hiredis missing or too old for this redis-py"
    client = sync_client(redis_url)
    connection = client.connection_pool.get_connection()
    try:
        assert type(connection._parser).__name__ == "_HiredisParser"
        assert client.ping()
    finally:
        client.connection_pool.release(connection)
        client.close()


def test_async_pool_parses_with_hiredis(redis_url: str) -> None:
    async def parser_name() -> str:
        pool = async_pool(redis_url, size=2, socket_timeout=5.0)
        connection = await pool.get_connection()
        try:
            await connection.connect()
            return type(connection._parser).__name__
        finally:
            await pool.release(connection)
            await pool.disconnect()

    assert asyncio.run(parser_name()) == "_AsyncHiredisParser"


# Counts its runs, then holds Redis past the client's socket timeout (a slow command): 0.3 s against
# 0.2, so a client that retried would have its reconnect answered in time and send it again.
SLOW_LUA = """
redis.call('INCR', KEYS[1])
local start = redis.call('TIME')
local function ms(t) return tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000 end
while ms(redis.call('TIME')) - ms(start) < tonumber(ARGV[1]) do end
return 1
"""


def _runs_after_settling(redis_url: str, key: str) -> int:
    probe = sync_client(redis_url)
    try:
        time.sleep(0.8)  # a resent script would have run by then
        return int(probe.get(key) or 0)
    finally:
        probe.delete(key)
        probe.close()


def test_sync_client_does_not_send_a_timed_out_command_again(redis_url: str) -> None:
    key = f"vlmqtest-slow-{uuid.uuid4().hex}"
    client = sync_client(redis_url, socket_timeout=0.2)
    try:
        with pytest.raises(redis.TimeoutError):
            client.eval(SLOW_LUA, 1, key, 300)
    finally:
        client.close()
    assert _runs_after_settling(redis_url, key) == 1


def test_async_pool_does_not_send_a_timed_out_command_again(redis_url: str) -> None:
    key = f"vlmqtest-slow-{uuid.uuid4().hex}"

    async def slow_call() -> None:
        pool = async_pool(redis_url, size=2, socket_timeout=0.2)
        client = aioredis.Redis(connection_pool=pool)
        try:
            await client.eval(SLOW_LUA, 1, key, 300)  # type: ignore[misc]
        finally:
            await pool.disconnect()

    with pytest.raises(redis.TimeoutError):
        asyncio.run(slow_call())
    assert _runs_after_settling(redis_url, key) == 1
