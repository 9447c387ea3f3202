"""Several images per request and per conversation, at the gateway: every route takes them (form:
several ``image`` fields; JSON and WebSocket: a list; OpenAI: several ``image_url`` parts), each
image is read and stored once, turns name the images they show, and more than
``VLMQ_MAX_IMAGES_PER_REQUEST`` is a 400 that leaves nothing behind."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import httpx
import openai
import pytest
import redis
from websockets.asyncio.client import connect

from shared.jobs import JobRecord
from tests.gateway.test_validation import assert_refused
from tests.gateway.workerside import decode_tasks, record_turn
from tests.support.jobs import image_bytes
from tests.support.stack import ServiceStack

PNGS = [image_bytes("PNG", (64 + 8 * i, 64), seed=40 + i) for i in range(6)]
DIGESTS = [hashlib.sha256(p).hexdigest() for p in PNGS]


def data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def spec_of(r: redis.Redis, gateway: ServiceStack, job_id: str) -> Any:
    return JobRecord.from_hash(r.hgetall(gateway.keys.job(job_id))).spec


def files(*pngs: bytes) -> list[tuple[str, tuple[str, bytes, str]]]:
    return [("image", (f"{i}.png", png, "image/png")) for i, png in enumerate(pngs)]


async def test_two_files_in_one_form_then_a_third_in_the_session(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis
) -> None:
    first = await client.post("/v1/jobs", data={"prompt": "Compare."}, files=files(PNGS[0], PNGS[1], PNGS[0]))
    assert first.status_code == 202, first.text
    spec = spec_of(r, gateway, first.json()["id"])
    assert spec.messages[-1].images == DIGESTS[:2] and spec.image_digest == DIGESTS[0]
    assert [r.get(gateway.keys.image(d)) for d in DIGESTS[:2]] == PNGS[:2]
    assert first.json()["id"] in decode_tasks(r, gateway.key_prefix)
    assert record_turn(r, gateway.keys, spec, "Red and blue.")
    body = {"prompt": "And this one?", "session_id": first.json()["session_id"], "image": data_url(PNGS[2])}
    follow = await client.post("/v1/jobs", json=body)
    assert follow.status_code == 202, follow.text
    spec2 = spec_of(r, gateway, follow.json()["id"])
    assert [t.images for t in spec2.messages] == [DIGESTS[:2], [], [DIGESTS[2]]]
    assert spec2.image_digests() == DIGESTS[:3]
    view = (await client.get(f"/v1/sessions/{spec2.conversation_id}")).json()
    assert view["images"] == DIGESTS[:2]  # the third joins once its turn is recorded


async def test_a_text_only_session_gains_images(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis
) -> None:
    first = (await client.post("/v1/jobs", json={"prompt": "Hello."})).json()
    assert record_turn(r, gateway.keys, spec_of(r, gateway, first["id"]), "Hi.")
    body = {
        "prompt": "Look.",
        "session_id": first["session_id"],
        "image": [data_url(PNGS[3]), data_url(PNGS[4])],
    }
    resp = (await client.post("/v1/jobs", json=body)).json()
    spec = spec_of(r, gateway, resp["id"])
    assert spec.image_digest == DIGESTS[3] and spec.messages[-1].images == DIGESTS[3:5]
    stored: Any = r.hgetall(gateway.keys.conversation(first["session_id"]))
    assert stored[b"image_digest"].decode() == DIGESTS[3]  # the turn is recorded against it


async def test_too_many_images_are_refused(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis
) -> None:
    limit = gateway.settings.max_images_per_request
    many = [data_url(PNGS[i % 6]) for i in range(limit + 1)]
    error = await assert_refused(
        gateway, client.post("/v1/jobs", json={"prompt": "x", "image": many}), 400, "limit"
    )
    assert error["code"] == "too_many_images"
    first = (await client.post("/v1/jobs", json={"prompt": "x", "image": many[:limit]})).json()
    assert record_turn(r, gateway.keys, spec_of(r, gateway, first["id"]), "ok")
    more = {"prompt": "and?", "session_id": first["session_id"], "image": data_url(PNGS[5])}
    error = await assert_refused(gateway, client.post("/v1/jobs", json=more), 400, "new session")
    assert error["code"] == "too_many_images"


async def test_images_over_the_websocket(gateway: ServiceStack, r: redis.Redis) -> None:
    async with connect(f"{gateway.ws_url}/v1/chat/ws") as ws:
        await ws.send(json.dumps({"prompt": "Both?", "image": [data_url(PNGS[0]), data_url(PNGS[1])]}))
        accepted = json.loads(await ws.recv())
        assert accepted["type"] == "accepted", accepted
    assert spec_of(r, gateway, accepted["id"]).messages[-1].images == DIGESTS[:2]


@pytest.fixture
async def oai(gateway: ServiceStack) -> Any:
    async with openai.AsyncOpenAI(base_url=f"{gateway.base_url}/v1", api_key="sk-test", max_retries=0) as c:
        yield c


async def test_openai_image_parts_name_their_images(
    oai: openai.AsyncOpenAI, gateway: ServiceStack, r: redis.Redis
) -> None:
    def part(png: bytes) -> dict[str, Any]:
        return {"type": "image_url", "image_url": {"url": data_url(png)}}

    messages: Any = [
        {"role": "user", "content": [part(PNGS[0]), part(PNGS[1]), {"type": "text", "text": "Compare."}]},
        {"role": "assistant", "content": "Red and blue."},
        {"role": "user", "content": [part(PNGS[2]), {"type": "text", "text": "And this?"}]},
    ]
    with pytest.raises(openai.APITimeoutError):  # nobody answers here: only the job is looked at
        await oai.chat.completions.create(model="vlmq-tiny", messages=messages, timeout=1)
    spec = spec_of(r, gateway, decode_tasks(r, gateway.key_prefix)[0])
    assert [t.images for t in spec.messages] == [DIGESTS[:2], [], [DIGESTS[2]]]
    assert [t.image_at for t in spec.messages] == [[0, 0], [], [0]]
    interleaved: Any = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Compare this:"},
                part(PNGS[3]),
                {"type": "text", "text": "with this:"},
                part(PNGS[4]),
                {"type": "text", "text": "Which is red?"},
            ],
        }
    ]
    with pytest.raises(openai.APITimeoutError):
        await oai.chat.completions.create(model="vlmq-tiny", messages=interleaved, timeout=1)
    turn = spec_of(r, gateway, decode_tasks(r, gateway.key_prefix)[0]).messages[0]
    assert (turn.text, turn.images, turn.image_at) == (
        "Compare this:\nwith this:\nWhich is red?",
        DIGESTS[3:5],
        [13, 24],
    )
    too_many: Any = [{"role": "user", "content": [part(PNGS[i % 6]) for i in range(5)]}]
    with pytest.raises(openai.BadRequestError, match="limit"):
        await oai.chat.completions.create(model="vlmq-tiny", messages=too_many)
