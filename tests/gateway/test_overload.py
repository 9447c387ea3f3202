"""Admission (429 before anything is stored) and the stream connection pool (503, API unaffected)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

import httpx
from websockets.asyncio.client import connect

from tests.gateway.clients import read_sse
from tests.gateway.conftest import GATEWAY_ENV, stored_keys
from tests.support.jobs import image_bytes
from tests.support.stack import ServiceStack

PNG = image_bytes("PNG", (64, 64), seed=41)
DATA_URL = "data:image/png;base64," + base64.b64encode(PNG).decode()


def gateway_with(factory: Callable[..., ServiceStack], **env: str) -> ServiceStack:
    return factory(components=("gateway",), extra_env={**GATEWAY_ENV, **env})


async def test_full_queue_answers_429_with_retry_after_on_every_route(
    stack_factory: Callable[..., ServiceStack],
) -> None:
    gw = gateway_with(stack_factory, VLMQ_MAX_QUEUE_DEPTH="3")
    busy = {gw.keys.job(f"busy-{i}"): time.time() for i in range(3)}
    gw.redis.zadd(gw.keys.active_jobs(), busy)  # depth 3 = the cap
    before = stored_keys(gw)
    async with httpx.AsyncClient(base_url=gw.base_url, timeout=10) as client:
        files = {"image": ("a.png", PNG, "image/png")}
        started = time.perf_counter()
        resp = await client.post("/v1/jobs", data={"prompt": "Hi"}, files=files)
        assert time.perf_counter() - started < 1.0
        assert resp.status_code == 429 and resp.json()["error"]["code"] == "queue_full"
        assert int(resp.headers["retry-after"]) >= 1 and "retry in" in resp.json()["error"]["message"]
        body = {"model": gw.settings.model_name, "messages": [_user_turn()]}
        oai = await client.post("/v1/chat/completions", json=body)
        assert oai.status_code == 429 and oai.json()["error"]["type"] == "rate_limit_error"
        assert int(oai.headers["retry-after"]) >= 1
    async with connect(f"{gw.ws_url}/v1/chat/ws") as ws:
        await ws.send(json.dumps({"prompt": "Hi", "image": DATA_URL}))
        error = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert error["type"] == "error" and error["status"] == 429 and error["code"] == "queue_full"
    assert stored_keys(gw) == before  # no image, job, session or task was written


def _user_turn() -> dict[str, Any]:
    parts = [{"type": "image_url", "image_url": {"url": DATA_URL}}, {"type": "text", "text": "Hi"}]
    return {"role": "user", "content": parts}


async def test_full_stream_pool_is_a_503_and_never_starves_api_calls(
    stack_factory: Callable[..., ServiceStack],
) -> None:
    gw = gateway_with(stack_factory, VLMQ_STREAM_CONNECTIONS="2")
    async with (
        httpx.AsyncClient(base_url=gw.base_url, timeout=10) as client,
        contextlib.AsyncExitStack() as open_,
    ):
        ids = [await _submit(client) for _ in range(3)]
        for job_id in ids[:2]:  # jobs that never finish (no workers): the streams stay open
            resp = await open_.enter_async_context(client.stream("GET", f"/v1/jobs/{job_id}/events"))
            assert resp.status_code == 200
        await asyncio.sleep(0.3)
        third = await client.get(f"/v1/jobs/{ids[2]}/events")
        assert third.status_code == 503 and third.json()["error"]["code"] == "streams_full"
        started = time.perf_counter()
        await _submit(client)
        assert (await client.get(f"/v1/jobs/{ids[2]}")).status_code == 200
        assert (await client.get("/readyz")).status_code in (200, 503)
        assert time.perf_counter() - started < 2.0


async def _submit(client: httpx.AsyncClient) -> str:
    files = {"image": ("a.png", PNG, "image/png")}
    resp = await client.post("/v1/jobs", data={"prompt": "Hi"}, files=files)
    assert resp.status_code == 202, resp.text
    return str(resp.json()["id"])


async def test_admission_never_passes_the_cap_across_gateways(
    stack_factory: Callable[..., ServiceStack],
) -> None:
    """A burst at two gateway processes sharing one Redis: exactly the cap is admitted, the rest 429."""
    first = gateway_with(stack_factory, VLMQ_MAX_QUEUE_DEPTH="12")
    env = {**GATEWAY_ENV, "VLMQ_MAX_QUEUE_DEPTH": "12", "VLMQ_KEY_PREFIX": first.key_prefix}
    second = stack_factory(components=("gateway",), extra_env=env)
    async with (
        httpx.AsyncClient(base_url=first.base_url, timeout=30) as a,
        httpx.AsyncClient(base_url=second.base_url, timeout=30) as b,
    ):
        files = {"image": ("a.png", PNG, "image/png")}
        posts = [c.post("/v1/jobs", data={"prompt": "Hi"}, files=files) for c in (a, b) * 20]
        codes = sorted(r.status_code for r in await asyncio.gather(*posts))
    assert codes.count(202) == 12 and codes.count(429) == 28, codes  # no workers: nothing drains
    assert first.redis.zcard(first.keys.active_jobs()) == 12


async def test_stream_slots_are_taken_before_the_response_starts(
    stack_factory: Callable[..., ServiceStack],
) -> None:
    """Many streams opened at once: at most the limit get a 200, the others a clean 503, none cut off."""
    gw = gateway_with(stack_factory, VLMQ_STREAM_CONNECTIONS="4")
    async with httpx.AsyncClient(base_url=gw.base_url, timeout=10) as client:
        job_id = await _submit(client)

        async def open_stream() -> int:
            async with client.stream("GET", f"/v1/jobs/{job_id}/events") as resp:
                if resp.status_code == 200:
                    await asyncio.sleep(1.0)  # hold it while the others try
                    assert not resp.is_closed  # still open: never cut off after its 200
                return resp.status_code

        codes = await asyncio.gather(*[open_stream() for _ in range(12)])
        assert sorted(codes) == [200] * 4 + [503] * 8, codes
        second = await asyncio.gather(*[open_stream() for _ in range(4)])  # the slots came back
        assert second == [200] * 4


async def test_each_stream_gives_its_connection_back(stack_factory: Callable[..., ServiceStack]) -> None:
    """Streams give their connections of the stream pool back: three times as many streams as
    connections, one after the other, all read to the end."""
    gw = gateway_with(stack_factory, VLMQ_STREAM_CONNECTIONS="2")
    async with httpx.AsyncClient(base_url=gw.base_url, timeout=10) as client:
        started = time.perf_counter()
        for _ in range(6):
            job_id = await _submit(client)
            assert (await client.delete(f"/v1/jobs/{job_id}")).status_code == 200
            events = await read_sse(client, f"/v1/jobs/{job_id}/events")
            assert events[-1]["data"]["status"] == "cancelled", events
        assert time.perf_counter() - started < 4.0  # a connection kept would block the third (5 s)
