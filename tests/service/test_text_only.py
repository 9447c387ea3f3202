"""Text-only conversations through every real process, on every route: no decode task runs, the
answers equal the engine's batch-of-one uncached run, and a follow-up reuses the session KV."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
from websockets.asyncio.client import connect

from shared.jobs import JobRecord
from tests.service.conftest import Reference, wait_done
from tests.support.stack import ServiceStack

NO_CACHE = {"Cache-Control": "no-cache"}


def spec_of(stack: ServiceStack, job_id: str) -> Any:
    return JobRecord.from_hash(stack.redis.hgetall(stack.keys.job(job_id))).spec


async def test_a_text_only_session_on_the_jobs_route(
    client: httpx.AsyncClient, service_stack: ServiceStack, reference: Reference
) -> None:
    first = await client.post(
        "/v1/jobs", data={"prompt": "What can you do?", "max_tokens": "10"}, headers=NO_CACHE
    )
    assert first.status_code == 202, first.text
    view = await wait_done(client, first.json()["id"])
    assert view["status"] == "done", view
    assert view["final_text"] == reference.answer(spec_of(service_stack, view["id"]), None)
    assert view["timings"]["decode"] == 0.0  # no decode worker saw it
    sid = first.json()["session_id"]
    follow = await client.post(
        "/v1/jobs", data={"prompt": "And then?", "session_id": sid, "max_tokens": "10"}, headers=NO_CACHE
    )
    view2 = await wait_done(client, follow.json()["id"])
    spec2 = spec_of(service_stack, view2["id"])
    assert [t.text for t in spec2.messages] == ["What can you do?", view["final_text"], "And then?"]
    assert view2["final_text"] == reference.answer(spec2, None)
    usage = view2["usage"]
    assert usage["cached_tokens"] >= usage["prompt_tokens"] - 12, usage  # the session KV, not a recompute


async def test_a_text_only_openai_chat_stream_and_not(
    service_stack: ServiceStack, reference: Reference
) -> None:
    model = service_stack.settings.model_name
    messages: Any = [{"role": "user", "content": "Tell me about shapes."}]
    async with openai.AsyncOpenAI(base_url=f"{service_stack.base_url}/v1", api_key="sk-none") as oai:
        full = await oai.chat.completions.create(
            model=model, messages=messages, max_tokens=10, user="text-chat-1", extra_headers=NO_CACHE
        )
        stream: Any = await oai.chat.completions.create(
            model=model, messages=messages, max_tokens=10, stream=True, extra_headers=NO_CACHE
        )
        streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        text = full.choices[0].message.content or ""
        assert text == streamed == reference.answer(spec_of(service_stack, full.id[len("chatcmpl-") :]), None)
        turn2: Any = [*messages, {"role": "assistant", "content": text}, {"role": "user", "content": "More?"}]
        second = await oai.chat.completions.create(
            model=model, messages=turn2, max_tokens=10, user="text-chat-1", extra_headers=NO_CACHE
        )
    spec2 = spec_of(service_stack, second.id[len("chatcmpl-") :])
    assert second.choices[0].message.content == reference.answer(spec2, None)
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    cached = second.usage.prompt_tokens_details.cached_tokens or 0
    assert cached >= second.usage.prompt_tokens - 12, second.usage


async def test_a_text_only_chat_over_the_websocket(service_stack: ServiceStack, reference: Reference) -> None:
    async with connect(f"{service_stack.ws_url}/v1/chat/ws") as ws:
        await ws.send(json.dumps({"prompt": "Hello there.", "max_tokens": 8, "no_cache": True}))
        accepted = json.loads(await ws.recv())
        assert accepted["type"] == "accepted", accepted
        while (event := json.loads(await ws.recv()))["type"] not in ("done", "error"):
            pass
    assert event["type"] == "done", event
    assert event["final_text"] == reference.answer(spec_of(service_stack, accepted["id"]), None)
