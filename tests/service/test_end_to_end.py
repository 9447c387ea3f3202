"""The service end to end: gateway -> Celery decode -> inference worker -> events -> client."""

from __future__ import annotations

import asyncio
import base64
import re
from typing import Any

import httpx
import openai
import pytest
import redis

from shared.jobs import JobRecord
from tests.gateway.clients import read_sse, read_ws, token_text
from tests.service.conftest import Reference, wait_done
from tests.support.jobs import image_bytes
from tests.support.stack import ServiceStack

NO_CACHE = {"Cache-Control": "no-cache"}


async def submit(
    client: httpx.AsyncClient,
    data: bytes,
    prompt: str,
    headers: dict[str, str] | None = None,
    **fields: object,
) -> dict[str, object]:
    form = {"prompt": prompt, "max_tokens": "12", **{k: str(v) for k, v in fields.items()}}
    resp = await client.post(
        "/v1/jobs",
        data=form,
        files={"image": ("i.jpg", data, "image/jpeg")},
        headers=headers if headers is not None else NO_CACHE,
    )
    assert resp.status_code == 202, resp.text
    return resp.json()


def spec_of(stack: ServiceStack, job_id: str) -> JobRecord:
    return JobRecord.from_hash(stack.redis.hgetall(stack.keys.job(job_id)))


async def test_answer_matches_engine(
    client: httpx.AsyncClient, service_stack: ServiceStack, reference: Reference
) -> None:
    data = image_bytes("JPEG", (480, 320), seed=11)
    job = await submit(client, data, "What colour is the square?")
    view = await wait_done(client, str(job["id"]))
    assert view["status"] == "done", view
    expected = reference.answer(spec_of(service_stack, str(job["id"])).spec, data)
    assert view["final_text"] == view["text"] == expected
    timings = view["timings"]
    assert timings["decode"] > 0 and timings["total"] >= timings["ttft"] > 0
    assert view["usage"]["completion_tokens"] > 0


async def test_min_tokens_and_ignore_eos_answer_like_the_engine(
    client: httpx.AsyncClient, service_stack: ServiceStack, reference: Reference
) -> None:
    """A long answer on request (what the web page's stop button is tested with): min_tokens holds
    EOS back, ignore_eos runs to max_tokens; both equal the engine's own answer to the same spec."""
    data = image_bytes("JPEG", (320, 240), seed=14)
    for fields, tokens in (({"min_tokens": 20}, 20), ({"ignore_eos": "true"}, 40)):
        job = await submit(client, data, "What colour is the square?", max_tokens=40, **fields)
        view = await wait_done(client, str(job["id"]))
        assert view["status"] == "done", view
        assert view["usage"]["completion_tokens"] >= tokens
        assert view["final_text"] == reference.answer(spec_of(service_stack, str(job["id"])).spec, data)


async def test_ws_and_sse_same_text_and_resume(
    client: httpx.AsyncClient, service_stack: ServiceStack
) -> None:
    data = image_bytes("PNG", (256, 256), seed=12)
    resp = await client.post(
        "/v1/jobs",
        data={"prompt": "Describe the picture.", "max_tokens": "24"},
        files={"image": ("i.png", data, "image/png")},
        headers=NO_CACHE,
    )
    job_id = resp.json()["id"]
    ws_task = asyncio.create_task(read_ws(f"{service_stack.ws_url}/v1/jobs/{job_id}/stream"))
    sse_events = await read_sse(client, f"/v1/jobs/{job_id}/events")
    ws_events, code = await ws_task
    sse_data = [e["data"] for e in sse_events]
    final = sse_data[-1]["final_text"]
    assert sse_data[-1]["type"] == "done" and code == 1000
    assert token_text(sse_data) == token_text(ws_events) == final
    # Reconnect after every k-th token with the last id: never a gap, never a duplicate.
    token_ids = [e["id"] for e in sse_data if e["type"] == "token"]
    for k in (1, len(token_ids) // 2):
        first = sse_data[: [e["id"] for e in sse_data].index(token_ids[k - 1]) + 1]
        rest = await read_sse(
            client, f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": token_ids[k - 1]}
        )
        assert token_text(first) + token_text([e["data"] for e in rest]) == final
        resumed_ws, _ = await read_ws(
            f"{service_stack.ws_url}/v1/jobs/{job_id}/stream?last_event_id={token_ids[k - 1]}"
        )
        assert token_text(first) + token_text(resumed_ws) == final


async def test_openai_client(
    service_stack: ServiceStack, client: httpx.AsyncClient, reference: Reference
) -> None:
    data = image_bytes("JPEG", (320, 240), seed=13)
    url = "data:image/jpeg;base64," + base64.b64encode(data).decode()
    messages: Any = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": "How many shapes are there?"},
            ],
        }
    ]
    model = service_stack.settings.model_name
    async with openai.AsyncOpenAI(base_url=f"{service_stack.base_url}/v1", api_key="sk-none") as oai:
        full = await oai.chat.completions.create(
            model=model, messages=messages, max_tokens=12, temperature=0, extra_headers=NO_CACHE
        )
        stream: Any = await oai.chat.completions.create(
            model=model, messages=messages, max_tokens=12, stream=True, extra_headers=NO_CACHE
        )
        streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    text = full.choices[0].message.content
    spec = spec_of(service_stack, full.id.removeprefix("chatcmpl-")).spec
    assert text == streamed == reference.answer(spec, data)
    assert full.usage is not None and full.usage.completion_tokens > 0
    # The same question through /v1/jobs gets the same greedy answer.
    job = await submit(client, data, "How many shapes are there?")
    assert (await wait_done(client, str(job["id"])))["final_text"] == text


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        named = line.startswith((name + "{", name + " "))
        if named and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def session_hits(client: httpx.AsyncClient) -> float:
    return metric((await client.get("/metrics")).text, "vlmq_cache_hits_total", cache="session")


async def test_two_turn_session_uses_session_cache(
    client: httpx.AsyncClient, service_stack: ServiceStack, reference: Reference
) -> None:
    data = image_bytes("JPEG", (300, 300), seed=14)
    first = await submit(client, data, "What colour is the square?", max_tokens=8)
    view1 = await wait_done(client, str(first["id"]))
    assert view1["status"] == "done"
    await asyncio.sleep(1.2)  # two heartbeats: the stats include turn 1
    hits_before = await session_hits(client)
    resp = await client.post(
        "/v1/jobs",
        json={"prompt": "And the circle?", "session_id": first["session_id"], "max_tokens": 8},
        headers=NO_CACHE,
    )
    assert resp.status_code == 202, resp.text
    view2 = await wait_done(client, resp.json()["id"])
    spec2 = spec_of(service_stack, resp.json()["id"]).spec
    assert [t.role for t in spec2.messages] == ["user", "assistant", "user"]
    assert spec2.messages[1].text == view1["final_text"]
    assert view2["final_text"] == reference.answer(spec2, data)
    assert view2["usage"]["cached_tokens"] > 0
    for _ in range(30):
        if await session_hits(client) > hits_before:
            break
        await asyncio.sleep(0.2)
    assert await session_hits(client) > hits_before
    turns = (await client.get(f"/v1/sessions/{first['session_id']}")).json()["turns"]
    assert [t["role"] for t in turns] == ["user", "assistant", "user", "assistant"]


async def test_fifty_concurrent_jobs(client: httpx.AsyncClient) -> None:
    images = [image_bytes("JPEG", (160 + 8 * i, 120), seed=i) for i in range(10)]

    async def one(i: int) -> dict[str, object]:
        job = await submit(client, images[i % 10], f"Question {i}: what is in the image?", max_tokens=4)
        return await wait_done(client, str(job["id"]), timeout_s=150)

    views = await asyncio.gather(*(one(i) for i in range(50)))
    assert [v["status"] for v in views] == ["done"] * 50


async def test_corrupt_image_body_fails_clearly(client: httpx.AsyncClient) -> None:
    full = image_bytes("PNG", (400, 300), seed=15)
    idat = full.index(b"IDAT") + 4
    broken = full[:idat] + bytes(64) + full[idat + 64 :]  # every chunk whole, compressed pixels garbage
    job = await submit(client, broken, "What is it?")
    view = await wait_done(client, str(job["id"]))
    assert view["status"] == "failed" and re.search(r"corrupt|truncated", view["error"], re.I)
    cut = image_bytes("JPEG", (400, 300), seed=15)
    resp = await client.post(  # cut off: the gateway sees it from the structure (no end marker)
        "/v1/jobs", data={"prompt": "x"}, files={"image": ("a.jpg", cut[: len(cut) // 3], "image/jpeg")}
    )
    assert resp.status_code == 400 and "truncated" in resp.json()["error"]["message"]
    resp = await client.post(
        "/v1/jobs", data={"prompt": "x"}, files={"image": ("a.png", b"GIF89a....", "image/png")}
    )
    assert resp.status_code == 415 and "JPEG, PNG, WebP" in resp.json()["error"]["message"]


async def test_result_cache(client: httpx.AsyncClient, service_stack: ServiceStack) -> None:
    data = image_bytes("JPEG", (200, 150), seed=16)
    first = await submit(client, data, "Cache me?", headers={}, session_id="cache-a")
    assert (await wait_done(client, str(first["id"])))["status"] == "done"
    text = (await wait_done(client, str(first["id"])))["final_text"]
    hit = await client.post(
        "/v1/jobs",
        data={"prompt": "Cache me?", "max_tokens": "12", "session_id": "cache-b"},
        files={"image": ("i.jpg", data, "image/jpeg")},
    )
    assert hit.json()["status"] == "done" and hit.json()["text"] == text
    assert hit.headers["cache-control"].startswith("public, max-age=")
    bypass = await client.post(
        "/v1/jobs",
        data={"prompt": "Cache me?", "max_tokens": "12", "session_id": "cache-c"},
        files={"image": ("i.jpg", data, "image/jpeg")},
        headers=NO_CACHE,
    )
    # not served from the cache: queued, or waiting (its picture was decoded before: it goes straight
    # to the worker that holds it)
    assert bypass.json()["status"] in ("queued", "waiting")
    assert "public" not in bypass.headers["cache-control"]
    assert (await wait_done(client, bypass.json()["id"]))["final_text"] == text


async def test_ready_and_metrics(client: httpx.AsyncClient, service_stack: ServiceStack) -> None:
    ready = await client.get("/readyz")
    assert ready.status_code == 200, ready.text
    text = (await client.get("/metrics")).text
    assert metric(text, "vlmq_jobs_total", outcome="done") > 0
    assert metric(text, "vlmq_time_to_first_token_seconds_count") > 0
    assert "vlmq_queue_depth{" in text and "vlmq_engine_batch_size_bucket" in text
    assert metric(text, "vlmq_workers_alive") == 1


@pytest.fixture(autouse=True)
def _redis_ok(service_stack: ServiceStack) -> redis.Redis:
    return service_stack.redis
