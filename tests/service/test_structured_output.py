"""Structured output through every real process and the official ``openai`` client: ``json_schema``
and ``json_object`` answers parse and validate, alone and batched with free-text requests, and
equal the engine's batch-of-one uncached run (so batching and caches never change them)."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai

from shared.jobs import JobRecord
from tests.service.conftest import Reference, wait_done
from tests.support.stack import ServiceStack

NO_CACHE = {"Cache-Control": "no-cache"}
SHAPES = Path("examples/shapes.png").read_bytes()
COUNT = Path("examples/count.png").read_bytes()
COLOUR = {
    "type": "object",
    "properties": {
        "colour": {"enum": ["red", "green", "blue", "yellow", "orange", "purple", "pink", "cyan"]}
    },
    "required": ["colour"],
    "additionalProperties": False,
}
SHAPE = {
    "type": "object",
    "properties": {"shape": {"type": "string", "maxLength": 12}, "count": {"type": "integer", "maximum": 6}},
    "required": ["shape", "count"],
    "additionalProperties": False,
}


def ask(data: bytes, question: str) -> Any:
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": question}]
    return [{"role": "user", "content": content}]


def json_schema(schema: dict[str, Any], name: str) -> Any:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def spec_of(stack: ServiceStack, completion_id: str) -> Any:
    job_id = completion_id.removeprefix("chatcmpl-")
    return JobRecord.from_hash(stack.redis.hgetall(stack.keys.job(job_id))).spec


async def test_json_schema_stream_and_not(service_stack: ServiceStack, reference: Reference) -> None:
    model = service_stack.settings.model_name
    fmt = json_schema(COLOUR, "colour")
    async with openai.AsyncOpenAI(base_url=f"{service_stack.base_url}/v1", api_key="sk-none") as oai:
        full = await oai.chat.completions.create(
            model=model, messages=ask(SHAPES, "What colour is the circle?"), response_format=fmt,
            max_tokens=32, extra_headers=NO_CACHE,
        )  # fmt: skip
        stream: Any = await oai.chat.completions.create(
            model=model, messages=ask(SHAPES, "What colour is the circle?"), response_format=fmt,
            max_tokens=32, stream=True, extra_headers=NO_CACHE,
        )  # fmt: skip
        streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    text = full.choices[0].message.content or ""
    assert full.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(text), COLOUR)
    assert json.loads(text) == {"colour": "red"}  # the bundled model answers in JSON (issue 21)
    assert streamed == text == reference.answer(spec_of(service_stack, full.id), SHAPES)


async def test_constrained_and_free_requests_batched_together(
    service_stack: ServiceStack, reference: Reference
) -> None:
    """Seven requests at once: two schemas, one JSON object, four free; every answer is the
    engine's batch-of-one answer, and every constrained one parses and validates."""
    model = service_stack.settings.model_name
    cases: list[tuple[bytes, str, Any, dict[str, Any] | None]] = [
        (SHAPES, "What colour is the square?", json_schema(COLOUR, "colour"), COLOUR),
        (COUNT, "What colour is the star?", json_schema(COLOUR, "colour"), COLOUR),
        (COUNT, "How many shapes are there?", json_schema(SHAPE, "shape"), SHAPE),
        (COUNT, "What colour is the star?", {"type": "json_object"}, {"type": "object"}),
        (SHAPES, "What colour is the circle?", None, None),
        (COUNT, "How many shapes are there?", None, None),
        (SHAPES, "What shape is big?", None, None),
    ]
    async with openai.AsyncOpenAI(base_url=f"{service_stack.base_url}/v1", api_key="sk-none") as oai:

        async def one(data: bytes, question: str, fmt: Any) -> Any:
            extra = {"response_format": fmt} if fmt else {}
            return await oai.chat.completions.create(
                model=model, messages=ask(data, question), max_tokens=32, extra_headers=NO_CACHE, **extra
            )

        answers = await asyncio.gather(*[one(d, q, f) for d, q, f, _ in cases])
    for (data, _, _, schema), answer in zip(cases, answers, strict=True):
        text = answer.choices[0].message.content or ""
        if schema is not None:
            assert answer.choices[0].finish_reason == "stop", text
            jsonschema.validate(json.loads(text), schema)
        assert text == reference.answer(spec_of(service_stack, answer.id), data)


async def test_json_schema_on_the_jobs_route(
    client: httpx.AsyncClient, service_stack: ServiceStack, reference: Reference
) -> None:
    form = {
        "prompt": "What colour is the circle?",
        "max_tokens": "32",
        "response_format": json.dumps(json_schema(COLOUR, "colour")),
    }
    resp = await client.post(
        "/v1/jobs", data=form, files={"image": ("s.png", SHAPES, "image/png")}, headers=NO_CACHE
    )
    assert resp.status_code == 202, resp.text
    view = await wait_done(client, resp.json()["id"])
    jsonschema.validate(json.loads(view["final_text"]), COLOUR)
    spec = JobRecord.from_hash(service_stack.redis.hgetall(service_stack.keys.job(view["id"]))).spec
    assert view["final_text"] == reference.answer(spec, SHAPES)
