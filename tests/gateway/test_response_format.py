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


ARRAY = {"type": "array", "items": {"type": "integer"}}
OBJECT_A = {"type": "object", "properties": {"a": {"type": "string"}}}


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
    # what xgrammar refuses to compile: refused here, the C++ reason never reaches the client
    (with_schema({"$ref": "#/$defs/nope"}), "$ref '#/$defs/nope' at '#' points to no subschema"),
    (with_schema({"properties": {"a": {"$ref": "#/definitions/x"}}}), "at '#/properties/a' points to no"),
    (with_schema({"$defs": {"a~b": {}}, "$ref": "#/$defs/a~1b"}), "'#/$defs/a~1b' at '#' points to no"),
    (with_schema({"$ref": "#"}), "loops"),
    (with_schema({"$defs": {"x": {"type": "string"}}, "$ref": "#x"}), "only local $ref"),
    (
        with_schema({"type": "string", "minLength": 5, "maxLength": 2}),
        "minLength 5 is above maxLength 2 at '#'",
    ),
    (with_schema(ARRAY | {"minItems": 3, "maxItems": 1}), "minItems 3 is above maxItems 1"),
    (with_schema({"type": "object", "minProperties": 3, "maxProperties": 1}), "minProperties 3 is above"),
    (with_schema({"type": "object", "properties": {"a": {"enum": []}}}), "enum at '#/properties/a' is empty"),
    (with_schema({"type": "integer", "minimum": 5, "maximum": 1}), "no integer is within the bounds at '#'"),
    (with_schema({"type": "integer", "exclusiveMinimum": 1, "exclusiveMaximum": 2}), "no integer"),
    (with_schema({"type": "number", "minimum": 1, "exclusiveMaximum": 1}), "no number"),
    (with_schema({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1e-7}), "at most 6 decimals"),
    (with_schema({"type": "integer", "minimum": 0.5}), "whole 64-bit number"),
    (with_schema({"type": "integer", "maximum": 1e20}), "whole 64-bit number"),
    (with_schema({"type": "object", "properties": {"a": False}}), "false at '#/properties/a'"),
    (
        with_schema({"type": "object", "minProperties": 1}),
        "without additionalProperties the grammar allows no others",
    ),
    (with_schema({"type": "array", "minItems": 1}), "without items the grammar allows no others"),
    (with_schema({"properties": {"a": {"$id": "https://x.test/a"}}}), "'$id' is only supported at the root"),
    # what the grammar compiles but does not hold an answer to
    (
        with_schema({"type": "object", "required": ["colour"]}),
        "required 'colour' at '#' is not declared under",
    ),
    (with_schema(OBJECT_A | {"required": ["colour"], "additionalProperties": False}), "declare it under"),
    (with_schema({"$defs": {"s": {"type": "string"}}, "$ref": "#/$defs/s", "maxLength": 2}), "beside '$ref'"),
    (with_schema({"type": "string", "anyOf": [{"type": "string"}, {"type": "integer"}]}), "beside 'anyOf'"),
    (with_schema({"enum": ["a", "bbbb"], "minLength": 2}), "'minLength' beside 'enum'"),
    (with_schema({"type": "string", "enum": ["a", 1]}), "the value 1 at '#' is not of its type string"),
    (with_schema({"type": "string", "pattern": "^[a-z]+$", "maxLength": 3}), "enforces only the pattern"),
    (with_schema({"type": "string", "format": "date", "maxLength": 5}), "enforces only the format"),
    (with_schema({"maxLength": 2}), 'needs a "type" beside it'),
    (with_schema({"type": "number", "multipleOf": 0.5}), "multipleOf at '#' is only enforced"),
    (with_schema({"type": "object", "additionalProperties": True, "minProperties": 2}), "beside additional"),
    (
        with_schema({"type": "string", "pattern": "(?:" * 600 + "a" + ")" * 600}),
        "nests its groups too deeply",
    ),
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


# Schemas the grammar holds answers to (measured against xgrammar): they must stay accepted.
GOOD = [
    {  # what pydantic writes for a model with a nested one, an enum, an optional and a tuple
        "$defs": {
            "Colour": {"enum": ["red", "blue"], "title": "Colour", "type": "string"},
            "Inner": {
                "properties": {"x": {"maximum": 10, "minimum": 0, "type": "integer"}},
                "required": ["x"],
                "type": "object",
            },
        },
        "properties": {
            "colour": {"$ref": "#/$defs/Colour"},
            "inner": {"$ref": "#/$defs/Inner", "description": "the inner one"},
            "maybe": {"anyOf": [{"$ref": "#/$defs/Inner"}, {"type": "null"}], "default": None},
            "pair": {
                "maxItems": 2,
                "minItems": 2,
                "prefixItems": [{"type": "integer"}, {"type": "string"}],
                "type": "array",
            },
            "ratio": {"maximum": 1, "minimum": 0, "type": "number"},
            "code": {"pattern": "^[A-Z]{3}$", "type": "string"},
            "tags": {"items": {"type": "string"}, "maxItems": 3, "minItems": 1, "type": "array"},
            "kids": {"items": {"$ref": "#"}, "type": "array"},
        },
        "required": ["colour", "inner", "pair"],
        "title": "Model",
        "type": "object",
    },
    {"type": "object", "properties": {"a/b": {"type": "integer"}, "c": {"$ref": "#/properties/a~1b"}}},
    {
        "type": "object",
        "properties": {"a b": {"const": 1, "type": "integer"}, "c": {"$ref": "#/properties/a%20b"}},
    },
    {"type": "integer", "exclusiveMinimum": 1, "maximum": 2, "multipleOf": 2},
    {"type": "number", "minimum": 1.000001, "maximum": 1.000002},
    {"type": ["string", "null"], "minLength": 1, "maxLength": 1},
    {"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 2},
    {  # pydantic's HttpUrl and Optional[AnyUrl]: lengths beside a format that cannot bind
        "type": "object",
        "properties": {
            "site": {"format": "uri", "maxLength": 2083, "minLength": 1, "type": "string"},
            "other": {"anyOf": [{"format": "uri", "minLength": 1, "type": "string"}, {"type": "null"}]},
        },
        "required": ["site"],
    },
]


@pytest.mark.parametrize("schema", GOOD)
async def test_schemas_the_grammar_holds_are_accepted(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis, schema: dict[str, Any]
) -> None:
    resp = await client.post("/v1/jobs", json={"prompt": "Hi", "response_format": with_schema(schema)})
    assert resp.status_code == 202, resp.text
    got = spec_of(r, gateway, resp.json()["id"]).sampling.response_format
    assert json.loads(got.json_schema) == schema


def nested(levels: int, kind: str) -> str:
    """The schema as JSON text: deeper than Python's own encoder goes."""
    opening = '{"type":"array","items":' if kind == "array" else '{"type":"object","properties":{"a":'
    closing = "}" if kind == "array" else "}}"
    return opening * levels + '{"type":"string"}' + closing * levels


@pytest.mark.parametrize("kind", ["array", "object"])
async def test_a_deep_schema_is_refused_and_the_connection_serves_on(
    gateway: ServiceStack, kind: str
) -> None:
    """Hundreds of levels used to exhaust the validator's stack (a 500) before the depth check. At a
    thousand, the JSON reader's own limit refuses the body (400) before the schema is read."""
    one = httpx.Limits(max_connections=1)
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=30, limits=one) as client:
        for levels in (33, 200):
            post = chat_with_schema_text(client, nested(levels, kind))
            error = await assert_refused(gateway, post, 400, "nests deeper than 32 levels")
            assert error["code"] == "invalid_response_format"
        assert (await chat_with_schema_text(client, nested(1000, kind))).status_code == 400
        models = await client.get("/v1/models")  # the same connection, still served
        assert models.status_code == 200 and models.json()["data"][0]["id"] == "vlmq-tiny"


def chat_with_schema_text(client: httpx.AsyncClient, schema: str) -> Any:
    body = {"model": "vlmq-tiny", "messages": [{"role": "user", "content": "Hi"}]}
    text = json.dumps({**body, "response_format": with_schema({})}).replace("{}", schema)
    return client.post("/v1/chat/completions", content=text, headers={"Content-Type": "application/json"})


async def test_a_deep_form_field_is_refused(client: httpx.AsyncClient, gateway: ServiceStack) -> None:
    form = {"prompt": "Hi", "response_format": '{"a":' * 5000 + "1" + "}" * 5000}
    error = await assert_refused(gateway, client.post("/v1/jobs", data=form), 400, "nests deeper")
    assert error["code"] == "invalid_response_format"


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
async def test_a_schema_with_a_number_json_does_not_allow_is_refused(
    client: httpx.AsyncClient, gateway: ServiceStack, number: str
) -> None:
    """Python's JSON reader takes these (1e999 is infinity); no grammar can."""
    fmt = with_schema({"type": "number", "minimum": "NUMBER"})
    body = json.dumps({"prompt": "Hi", "response_format": fmt}).replace('"NUMBER"', number)
    post = client.post("/v1/jobs", content=body, headers={"Content-Type": "application/json"})
    error = await assert_refused(gateway, post, 400, "NaN or Infinity")
    assert error["code"] == "invalid_response_format"
