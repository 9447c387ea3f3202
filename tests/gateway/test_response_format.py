"""``response_format`` at the gateway: accepted shapes land in the job's sampling spec (jobs route,
form or JSON, and the official OpenAI client); what the grammar could not enforce is a 400 in
OpenAI's error shape, and leaves nothing behind."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
import redis

from shared.jobs import JobRecord
from tests.gateway.test_validation import assert_refused
from tests.gateway.workerside import decode_tasks
from tests.support.jobs import image_bytes
from tests.support.stack import ServiceStack

PNG = image_bytes("PNG", (96, 96), seed=5)
COLOUR = {"type": "object", "properties": {"colour": {"enum": ["red", "blue"]}}, "required": ["colour"]}


def spec_of(r: redis.Redis, gateway: ServiceStack, job_id: str) -> Any:
    return JobRecord.from_hash(r.hgetall(gateway.keys.job(job_id))).spec


@pytest.fixture
async def oai(gateway: ServiceStack) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{gateway.base_url}/v1", api_key="sk-test", max_retries=0) as c:
        yield c


async def test_json_schema_and_json_object_on_the_jobs_route(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis
) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "colour", "schema": COLOUR}}
    resp = await client.post("/v1/jobs", json={"prompt": "Colour?", "response_format": fmt})
    assert resp.status_code == 202, resp.text
    got = spec_of(r, gateway, resp.json()["id"]).sampling.response_format
    assert got.type == "json_schema" and got.name == "colour" and json.loads(got.json_schema) == COLOUR
    form = {"prompt": "Colour?", "response_format": json.dumps({"type": "json_object"})}
    resp = await client.post("/v1/jobs", data=form, files={"image": ("a.png", PNG, "image/png")})
    assert resp.status_code == 202, resp.text
    assert spec_of(r, gateway, resp.json()["id"]).sampling.response_format.type == "json_object"
    text = await client.post("/v1/jobs", json={"prompt": "Hi", "response_format": {"type": "text"}})
    assert spec_of(r, gateway, text.json()["id"]).sampling.response_format is None


async def test_the_openai_clients_response_format_lands_in_the_job(
    oai: openai.AsyncOpenAI, gateway: ServiceStack, r: redis.Redis
) -> None:
    """``response_format`` as the client sends it; the job is only queued (no worker here)."""
    raw = oai.with_raw_response.chat.completions.create
    url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    content: Any = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "Colour?"}]
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "c", "schema": COLOUR, "strict": True}}
    task = raw(
        model="vlmq-tiny", messages=[{"role": "user", "content": content}], response_format=fmt, timeout=1
    )
    with pytest.raises(openai.APITimeoutError):
        await task
    got = spec_of(r, gateway, decode_tasks(r, gateway.key_prefix)[0]).sampling.response_format
    assert got.name == "c" and json.loads(got.json_schema) == COLOUR


def with_schema(schema: dict[str, Any], name: str = "x") -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


BAD = [
    ({"type": "xml"}, "type must be one of"),
    ({"type": "json_schema"}, "schema object is required"),
    (with_schema({"type": "objectx"}), "not a valid JSON Schema"),
    (with_schema({"allOf": [{"type": "object"}]}), "'allOf'"),
    (with_schema({"properties": {"a": {"not": {}}}}), "'not' at '#/properties/a'"),
    (with_schema({"type": "array", "uniqueItems": True}), "uniqueItems"),
    (with_schema({"$ref": "https://x.test/s.json"}), "only local $ref"),
    (with_schema({"type": "string", "pattern": "^a(?=b)"}), "lookaround"),
    (with_schema({"type": "string", "pattern": "(unclosed"}), "not a valid"),
    ("{not json", "not valid JSON"),
    (5, "expected an object"),
]


@pytest.mark.parametrize(("fmt", "words"), BAD)
async def test_bad_formats_are_refused(
    client: httpx.AsyncClient, gateway: ServiceStack, fmt: Any, words: str
) -> None:
    error = await assert_refused(
        gateway, client.post("/v1/jobs", json={"prompt": "x", "response_format": fmt}), 400, words
    )
    assert error["code"] == "invalid_response_format" and error["param"].startswith("response_format")


async def test_refused_through_the_openai_client_and_with_stop(
    oai: openai.AsyncOpenAI, gateway: ServiceStack
) -> None:
    messages: Any = [{"role": "user", "content": "Hi"}]
    bad: Any = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}
    with pytest.raises(openai.BadRequestError) as info:
        await oai.chat.completions.create(model="vlmq-tiny", messages=messages, response_format=bad)
    assert info.value.status_code == 400 and "not a valid JSON Schema" in str(info.value)
    with pytest.raises(openai.BadRequestError, match="stop strings"):
        await oai.chat.completions.create(
            model="vlmq-tiny", messages=messages, response_format={"type": "json_object"}, stop=["}"]
        )
