"""Gateway under faults: SIGTERM with open streams, Redis going away and coming back."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from scripts.redis_launcher import start_redis
from tests.gateway.clients import read_sse
from tests.support.jobs import image_bytes
from tests.support.stack import ServiceStack

JPEG = image_bytes("JPEG", (64, 64), seed=44)
FILES = {"image": ("a.jpg", JPEG, "image/jpeg")}


async def test_sigterm_ends_open_streams_in_bounded_time(stack_factory: Callable[..., ServiceStack]) -> None:
    """No worker: the job never progresses, yet SIGTERM ends its SSE and WS streams and the
    gateway exits within seconds; the job is not cancelled by the gateway going away."""
    stack = stack_factory(components=("gateway",))
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=20) as client:
        job_id = (
            await client.post("/v1/jobs", data={"prompt": "x", "cancel_on_disconnect": "true"}, files=FILES)
        ).json()["id"]
        sse = asyncio.create_task(read_sse(client, f"/v1/jobs/{job_id}/events"))
        async with connect(f"{stack.ws_url}/v1/jobs/{job_id}/stream") as ws:
            assert '"queued"' in str(await ws.recv())
            await asyncio.sleep(0.3)
            start = time.monotonic()
            stack.procs["gateway"].signal(signal.SIGTERM, group=False)
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 10)
            assert ws.close_code in (1012, 1001)
        events = await asyncio.wait_for(sse, 10)
        assert [e["data"]["status"] for e in events] == ["queued"]  # ended without a terminal event
        stack.procs["gateway"].process.wait(10)  # type: ignore[union-attr]
        assert time.monotonic() - start < 8
        assert stack.redis.hget(stack.keys.job(job_id), "status") == b"queued"
        assert not stack.redis.exists(stack.keys.job_cancel(job_id))


async def test_redis_outage_is_a_fast_503_and_recovers(tmp_path_factory: pytest.TempPathFactory) -> None:
    server = start_redis()
    stack = ServiceStack(server.url, tmp_path_factory.mktemp("outage"), components=("gateway",))
    try:
        stack.start(timeout_s=60)
        async with httpx.AsyncClient(base_url=stack.base_url, timeout=20) as client:
            assert (await client.post("/v1/jobs", data={"prompt": "x"}, files=FILES)).status_code == 202
            port = server.port
            server.stop()
            start = time.monotonic()
            resp = await client.post("/v1/jobs", data={"prompt": "x"}, files=FILES)
            assert resp.status_code == 503 and resp.headers["retry-after"]
            assert "unavailable" in resp.json()["error"]["message"]
            assert (await client.get("/readyz")).status_code == 503
            assert (await client.get(f"/v1/jobs/{'f' * 32}")).status_code == 503  # a well-formed id
            assert time.monotonic() - start < 6
            assert (await client.get("/healthz")).status_code == 200  # alive, just not ready
            server = start_redis(port=port)
            for _ in range(50):
                resp = await client.post("/v1/jobs", data={"prompt": "x"}, files=FILES)
                if resp.status_code == 202:
                    break
                await asyncio.sleep(0.1)
            assert resp.status_code == 202, resp.text
    finally:
        stack.stop()
        server.stop()


async def test_first_requests_after_a_redis_restart_succeed(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every pooled connection died with Redis; each request retries once on a fresh one."""
    server = start_redis(data_dir=tmp_path_factory.mktemp("aof"))
    stack = ServiceStack(server.url, tmp_path_factory.mktemp("restart"), components=("gateway",))
    try:
        stack.start(timeout_s=60)
        async with httpx.AsyncClient(base_url=stack.base_url, timeout=20) as client:
            submitted = await asyncio.gather(
                *[client.post("/v1/jobs", data={"prompt": "x"}, files=FILES) for _ in range(8)]
            )
            ids = [r.json()["id"] for r in submitted]  # 8 requests at once: 8 pooled connections
            port, data_dir = server.port, server.workdir
            server.stop()
            server = start_redis(port=port, data_dir=data_dir)  # the AOF brings the jobs back
            polls = await asyncio.gather(*[client.get(f"/v1/jobs/{job_id}") for job_id in ids])
            assert [p.status_code for p in polls] == [200] * 8, [p.text for p in polls]
    finally:
        stack.stop()
        server.stop()
