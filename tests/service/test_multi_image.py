"""Several images through every real process and the official ``openai`` client: two images in one
message, then a follow-up that adds a third, each answer equal to the engine's batch-of-one
uncached run on the same pixels; and the same across stored turns on the jobs route."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import httpx
import openai

from shared.jobs import JobRecord
from tests.service.conftest import Reference, wait_done
from tests.support.jobs import image_bytes
from tests.support.stack import ServiceStack

NO_CACHE = {"Cache-Control": "no-cache"}
SHAPES, COUNT = Path("examples/shapes.png").read_bytes(), Path("examples/count.png").read_bytes()
THIRD = image_bytes("PNG", (200, 160), seed=91)


def part(png: bytes) -> dict[str, Any]:
    return {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()},
    }


def spec_of(stack: ServiceStack, job_id: str) -> Any:
    return JobRecord.from_hash(stack.redis.hgetall(stack.keys.job(job_id.removeprefix("chatcmpl-")))).spec


async def test_two_images_then_a_third_with_the_openai_client(
    service_stack: ServiceStack, reference: Reference
) -> None:
    model = service_stack.settings.model_name
    messages: Any = [
        {
            "role": "user",
            "content": [part(SHAPES), part(COUNT), {"type": "text", "text": "What colour is the star?"}],
        }
    ]
    async with openai.AsyncOpenAI(base_url=f"{service_stack.base_url}/v1", api_key="sk-none") as oai:
        first = await oai.chat.completions.create(
            model=model, messages=messages, max_tokens=10, user="multi-1", extra_headers=NO_CACHE
        )
        text = first.choices[0].message.content or ""
        assert text == reference.answer(spec_of(service_stack, first.id), [SHAPES, COUNT])
        messages += [
            {"role": "assistant", "content": text},
            {
                "role": "user",
                "content": [part(THIRD), {"type": "text", "text": "How many shapes are there?"}],
            },
        ]
        stream: Any = await oai.chat.completions.create(
            model=model, messages=messages, max_tokens=10, user="multi-1", stream=True,
            stream_options={"include_usage": True}, extra_headers=NO_CACHE,
        )  # fmt: skip
        chunks = [c async for c in stream]
    second = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    spec = spec_of(service_stack, chunks[0].id)
    assert [len(t.images) for t in spec.messages] == [2, 0, 1]
    assert second == reference.answer(spec, [SHAPES, COUNT, THIRD])
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert (usage.prompt_tokens_details.cached_tokens or 0) > 100  # the first turn's KV, images included


async def test_images_added_across_stored_turns(
    client: httpx.AsyncClient, service_stack: ServiceStack, reference: Reference
) -> None:
    files = [("image", ("a.png", SHAPES, "image/png")), ("image", ("b.png", COUNT, "image/png"))]
    first = await client.post(
        "/v1/jobs",
        data={"prompt": "What colour is the circle?", "max_tokens": "8"},
        files=files,
        headers=NO_CACHE,
    )
    assert first.status_code == 202, first.text
    view = await wait_done(client, first.json()["id"])
    assert view["final_text"] == reference.answer(spec_of(service_stack, view["id"]), [SHAPES, COUNT])
    follow = await client.post(
        "/v1/jobs",
        data={"prompt": "What shape is big?", "session_id": first.json()["session_id"], "max_tokens": "8"},
        files=[("image", ("c.png", THIRD, "image/png"))],
        headers=NO_CACHE,
    )
    view2 = await wait_done(client, follow.json()["id"])
    spec2 = spec_of(service_stack, view2["id"])
    assert [len(t.images) for t in spec2.messages] == [2, 0, 1]
    assert view2["status"] == "done" and view2["final_text"] == reference.answer(
        spec2, [SHAPES, COUNT, THIRD]
    )


async def test_text_and_images_interleaved_in_one_message(
    service_stack: ServiceStack, reference: Reference
) -> None:
    """Images stay where the client put them among the text (the job's ``image_at``); the model's
    chat template renders the prompt from there, and the answer is the batch-of-one answer to it."""
    content = [
        {"type": "text", "text": "First"},
        part(SHAPES),
        {"type": "text", "text": "then"},
        part(COUNT),
        {"type": "text", "text": "What colour is the star?"},
    ]
    async with openai.AsyncOpenAI(base_url=f"{service_stack.base_url}/v1", api_key="sk-none") as oai:
        done = await oai.chat.completions.create(
            model=service_stack.settings.model_name, messages=[{"role": "user", "content": content}],  # type: ignore[misc,list-item]
            max_tokens=10, extra_headers=NO_CACHE,
        )  # fmt: skip
    spec = spec_of(service_stack, done.id)
    assert spec.messages[0].image_at == [5, 10]
    assert (done.choices[0].message.content or "") == reference.answer(spec, [SHAPES, COUNT])
