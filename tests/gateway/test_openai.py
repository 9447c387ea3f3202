"""OpenAI-compatible API through the official ``openai`` client (workers played in Redis)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
import redis

from shared.jobs import JobRecord
from shared.schemas import JobStatus
from tests.gateway.workerside import decode_tasks, run_job
from tests.support.jobs import image_bytes
from tests.support.stack import ServiceStack, wait_for

PNG = image_bytes("PNG", (120, 90), seed=3)
DATA_URL = "data:image/png;base64," + base64.b64encode(PNG).decode()
PIECES = ["A", " blue", " circle", "."]


def user_turn(text: str, with_image: bool = True) -> Any:
    parts: list[dict[str, object]] = [{"type": "text", "text": text}]
    if with_image:
        parts.insert(0, {"type": "image_url", "image_url": {"url": DATA_URL}})
    return {"role": "user", "content": parts}


@pytest.fixture
async def oai(gateway: ServiceStack) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{gateway.base_url}/v1", api_key="sk-test", max_retries=0) as c:
        yield c


@pytest.fixture
async def fake_worker(gateway: ServiceStack, r: redis.Redis) -> AsyncIterator[list[str]]:
    """Answers every new decode task with PIECES (the workers' side, written into Redis)."""
    seen = set(decode_tasks(r, gateway.key_prefix))
    answered: list[str] = []

    async def loop() -> None:
        while True:
            for job_id in decode_tasks(r, gateway.key_prefix):
                if job_id not in seen:
                    seen.add(job_id)
                    run_job(r, gateway.keys, job_id, PIECES)
                    answered.append(job_id)
            await asyncio.sleep(0.02)

    task = asyncio.create_task(loop())
    yield answered
    task.cancel()


async def test_models(oai: openai.AsyncOpenAI, gateway: ServiceStack) -> None:
    models = await oai.models.list()
    assert [m.id for m in models.data] == [gateway.settings.model_name]


async def test_completion(
    oai: openai.AsyncOpenAI, gateway: ServiceStack, r: redis.Redis, fake_worker: list[str]
) -> None:
    resp = await oai.chat.completions.create(
        model=gateway.settings.model_name,
        messages=[user_turn("What shape?")],
        max_tokens=8,
        temperature=0,
        extra_headers={"Cache-Control": "no-cache"},
        extra_body={"min_tokens": 3, "ignore_eos": True},  # vLLM's extra sampling parameters
    )
    assert resp.object == "chat.completion"
    assert resp.choices[0].message.content == "A blue circle." and resp.choices[0].finish_reason == "stop"
    assert resp.usage is not None and resp.usage.completion_tokens == 4 and resp.usage.total_tokens == 124
    job_id = resp.id.removeprefix("chatcmpl-")
    assert job_id in fake_worker
    spec = JobRecord.from_hash(r.hgetall(gateway.keys.job(job_id))).spec
    assert spec.source == "openai" and spec.cancel_on_disconnect and spec.sampling.max_tokens == 8
    assert spec.sampling.min_tokens == 3 and spec.sampling.ignore_eos


async def test_streaming(oai: openai.AsyncOpenAI, gateway: ServiceStack, fake_worker: list[str]) -> None:
    stream: Any = await oai.chat.completions.create(
        model=gateway.settings.model_name,
        messages=[user_turn("What shape?")],
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"Cache-Control": "no-cache"},
    )
    chunks = [c async for c in stream]
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "A blue circle."
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4


async def test_history_and_session_affinity(
    oai: openai.AsyncOpenAI, gateway: ServiceStack, r: redis.Redis, fake_worker: list[str]
) -> None:
    messages: Any = [
        {"role": "system", "content": "Answer briefly."},
        user_turn("What shape?"),
        {"role": "assistant", "content": "A circle."},
        {"role": "user", "content": "What colour is it?"},
    ]
    resp = await oai.chat.completions.create(
        model=gateway.settings.model_name,
        messages=messages,
        extra_headers={"X-Session-Id": "conv-7", "Cache-Control": "no-cache"},
    )
    spec = JobRecord.from_hash(r.hgetall(gateway.keys.job(resp.id.removeprefix("chatcmpl-")))).spec
    assert spec.affinity_key == "conv-7" and spec.conversation_id is None
    assert [(t.role, t.text, t.image) for t in spec.messages] == [
        ("system", "Answer briefly.", False),
        ("user", "What shape?", True),
        ("assistant", "A circle.", False),
        ("user", "What colour is it?", False),
    ]
    resp = await oai.chat.completions.create(
        model=gateway.settings.model_name,
        messages=[user_turn("Hm?")],
        user="user-session-9",
        extra_headers={"Cache-Control": "no-cache"},
    )
    spec = JobRecord.from_hash(r.hgetall(gateway.keys.job(resp.id.removeprefix("chatcmpl-")))).spec
    assert spec.affinity_key == "user-session-9" and spec.conversation_id is None


@pytest.mark.parametrize(
    ("kwargs", "error", "status", "words"),
    [
        ({"model": "gpt-4o"}, openai.NotFoundError, 404, "not found"),
        ({"temperature": 5}, openai.UnprocessableEntityError, 422, "temperature"),
        (
            {"max_tokens": 4, "extra_body": {"min_tokens": 5}},
            openai.UnprocessableEntityError,
            422,
            "min_tokens",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}],
                    }
                ]
            },
            openai.BadRequestError,
            400,
            "base64",
        ),
        (
            {"messages": [user_turn("a"), {"role": "assistant", "content": "b"}]},
            openai.BadRequestError,
            400,
            "last message",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image_url",
                                "image_url": {
                                    "url": "data:image/gif;base64," + base64.b64encode(b"GIF89a....").decode()
                                },
                            }
                        ],
                    }
                ]
            },
            openai.APIStatusError,
            415,
            "unsupported",
        ),
    ],
    ids=["model", "temperature", "min-tokens", "base64", "last-not-user", "gif"],
)
async def test_error_shapes(
    oai: openai.AsyncOpenAI,
    gateway: ServiceStack,
    kwargs: dict[str, object],
    error: type[openai.APIStatusError],
    status: int,
    words: str,
) -> None:
    args: Any = {"model": gateway.settings.model_name, "messages": [user_turn("x")], **kwargs}
    with pytest.raises(error) as info:
        await oai.chat.completions.create(**args)
    assert info.value.status_code == status
    body = info.value.body
    assert isinstance(body, dict) and set(body) >= {
        "message",
        "type",
        "param",
        "code",
    }  # the client unwraps "error"
    assert words in body["message"]


async def test_retrieve_model(oai: openai.AsyncOpenAI, gateway: ServiceStack) -> None:
    name = gateway.settings.model_name
    assert (await oai.models.retrieve(name)).id == name
    with pytest.raises(openai.NotFoundError) as info:
        await oai.models.retrieve("gpt-4o")
    assert info.value.body["code"] == "model_not_found"  # type: ignore[index]


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"logprobs": True, "top_logprobs": 2}, "logprobs"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"logit_bias": {"42": 10}}, "logit_bias"),
    ],
    ids=["logprobs", "top-logprobs", "tools", "presence-penalty", "logit-bias"],
)
async def test_unsupported_parameters_are_refused(
    oai: openai.AsyncOpenAI, gateway: ServiceStack, kwargs: dict[str, Any], param: str
) -> None:
    """Asked for, a knob vlmq does not implement is a 400 naming it, not an answer without it."""
    args: Any = {"model": gateway.settings.model_name, "messages": [user_turn("x")], **kwargs}
    with pytest.raises(openai.BadRequestError) as info:
        await oai.chat.completions.create(**args)
    body: Any = info.value.body
    assert body["param"] == param and body["code"] == "unsupported_parameter"


async def test_neutral_values_of_unsupported_parameters_are_accepted(
    oai: openai.AsyncOpenAI, gateway: ServiceStack, fake_worker: list[str]
) -> None:
    """Clients that send every knob at its default are served."""
    resp = await oai.chat.completions.create(
        model=gateway.settings.model_name,
        messages=[user_turn("What shape?")],
        logprobs=False,
        presence_penalty=0,
        frequency_penalty=0,
        tools=[],  # type: ignore[arg-type]
        tool_choice="none",
        extra_headers={"Cache-Control": "no-cache"},
    )
    assert resp.choices[0].message.content == "A blue circle."


@pytest.mark.parametrize("content", [None, "", "  \n ", []], ids=["null", "empty", "blank", "no-parts"])
async def test_an_empty_question_is_refused(
    client: httpx.AsyncClient, gateway: ServiceStack, content: Any
) -> None:
    before = set(gateway.redis.scan_iter(match=f"{gateway.key_prefix}:*"))
    body = {"model": gateway.settings.model_name, "messages": [{"role": "user", "content": content}]}
    resp = await client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == "empty_message" and error["param"] == "messages[0].content"
    assert set(gateway.redis.scan_iter(match=f"{gateway.key_prefix}:*")) == before


@pytest.mark.parametrize(
    ("field", "raw", "words"),
    [
        ("temperature", "NaN", "finite number"),
        ("max_tokens", "true", "valid integer"),
        ("stream", '"yes"', "valid boolean"),
    ],
)
async def test_values_are_not_coerced(
    client: httpx.AsyncClient, gateway: ServiceStack, field: str, raw: str, words: str
) -> None:
    """``true`` is not a token count, ``"yes"`` not a boolean, NaN not a temperature."""
    messages = '[{"role": "user", "content": "hi"}]'
    body = f'{{"model": "{gateway.settings.model_name}", "messages": {messages}, "{field}": {raw}}}'
    resp = await client.post(
        "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    assert resp.status_code == 422, resp.text
    error = resp.json()["error"]
    assert error["param"] == field and words in error["message"]


@pytest.mark.parametrize(("url", "words"), [("file:///etc/passwd", "'file:' image URLs are not fetched")])
async def test_image_urls_of_other_schemes_are_named(
    client: httpx.AsyncClient, gateway: ServiceStack, url: str, words: str
) -> None:
    part = {"type": "image_url", "image_url": {"url": url}}
    turn = {"role": "user", "content": [{"type": "text", "text": "What colour?"}, part]}
    resp = await client.post(
        "/v1/chat/completions", json={"model": gateway.settings.model_name, "messages": [turn]}
    )
    assert resp.status_code == 400 and words in resp.json()["error"]["message"], resp.text


async def test_a_whole_float_is_a_count(
    oai: openai.AsyncOpenAI, gateway: ServiceStack, fake_worker: list[str]
) -> None:
    """``max_tokens: 100.0`` (a client that divided) is 100, as before; only booleans are refused."""
    args: Any = {
        "model": gateway.settings.model_name,
        "messages": [user_turn("What shape?")],
        "max_tokens": 100.0,
    }
    resp = await oai.chat.completions.create(**args, extra_headers={"Cache-Control": "no-cache"})
    assert resp.choices[0].message.content == "A blue circle."


async def test_a_body_that_is_not_json_is_a_400(client: httpx.AsyncClient) -> None:
    headers = {"content-type": "application/json"}
    resp = await client.post("/v1/chat/completions", content=b'{"model": "m", "messages": [', headers=headers)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == "bad_json" and error["param"] is None
    assert error["message"].startswith("body is not valid JSON") and "at character" in error["message"]


async def test_stream_disconnect_cancels_job(gateway: ServiceStack, r: redis.Redis) -> None:
    """Nobody answers: the client reads the first chunk, then goes away -> cancel flag + cancelled."""
    body = {"model": gateway.settings.model_name, "messages": [user_turn("Slow?")], "stream": True}
    async with (
        httpx.AsyncClient(base_url=gateway.base_url, timeout=10) as client,
        client.stream(
            "POST", "/v1/chat/completions", json=body, headers={"Cache-Control": "no-cache"}
        ) as resp,
    ):
        assert resp.status_code == 200
        job_id = resp.headers["x-vlmq-job-id"]
        async for line in resp.aiter_lines():
            if line.startswith("data:"):
                break
    wait_for(lambda: r.get(gateway.keys.job_cancel(job_id)), 5, what="cancel flag")
    cancelled = JobStatus.CANCELLED.value.encode()  # written just after the flag (cancel_job)
    wait_for(lambda: r.hget(gateway.keys.job(job_id), "status") == cancelled, 5, what="cancelled")


async def test_blocking_request_disconnect_cancels_job(gateway: ServiceStack, r: redis.Redis) -> None:
    before = set(decode_tasks(r, gateway.key_prefix))
    body = {"model": gateway.settings.model_name, "messages": [user_turn("Slow?")]}
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=0.5) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post("/v1/chat/completions", json=body, headers={"Cache-Control": "no-cache"})
    (job_id,) = set(decode_tasks(r, gateway.key_prefix)) - before
    wait_for(lambda: r.get(gateway.keys.job_cancel(job_id)), 5, what="cancel flag")
