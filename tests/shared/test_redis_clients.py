"""Our Redis clients parse replies in C (hiredis): a redis-py or hiredis upgrade that silently falls
back to the pure-Python parser costs every process ~60 us of CPU per pipeline or hash read."""

from __future__ import annotations

import asyncio

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
