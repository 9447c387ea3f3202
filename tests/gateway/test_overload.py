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
    gw.redis.rpush(gw.keys.decode_queue(), *[b"x"] * 2)
    gw.redis.xadd(gw.keys.inference_stream(), {"job_id": "busy"})  # depth 3 = the cap
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
