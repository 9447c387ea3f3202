"""A job whose images a live worker already decoded skips the decode hop (a follow-up, or a picture
sent before): the gateway hands it straight to that worker, which answers from them; a worker that
does not hold them sends the job back to decoding. Every answer equals the engine's uncached
batch-of-one run."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from shared.jobs import JobRecord
from tests.service.conftest import Reference, wait_done
from tests.support.jobs import image_bytes
from tests.support.stack import ServiceStack, running

NO_CACHE = {"Cache-Control": "no-cache"}


def record(stack: ServiceStack, job_id: str) -> tuple[JobRecord, dict[str, str]]:
    raw = stack.redis.hgetall(stack.keys.job(job_id))
    return JobRecord.from_hash(raw), {k.decode(): v.decode() for k, v in raw.items()}


async def picture_turn(
    client: httpx.AsyncClient, data: bytes, prompt: str = "What colour is the square?"
) -> dict[str, Any]:
    form = {"prompt": prompt, "max_tokens": "8"}
    files = {"image": ("i.jpg", data, "image/jpeg")}
    resp = await client.post("/v1/jobs", data=form, files=files, headers=NO_CACHE)
    assert resp.status_code == 202, resp.text
    view = await wait_done(client, resp.json()["id"])
    assert view["status"] == "done", view
    return view


async def follow_up(client: httpx.AsyncClient, session_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A text turn in the session: (the 202's body, the finished job)."""
    body = {"prompt": "And the circle?", "session_id": session_id, "max_tokens": 8}
    resp = await client.post("/v1/jobs", json=body, headers=NO_CACHE)
    assert resp.status_code == 202, resp.text
    return resp.json(), await wait_done(client, resp.json()["id"])


async def test_a_follow_up_is_answered_from_the_images_its_worker_holds(
    client: httpx.AsyncClient, service_stack: ServiceStack, reference: Reference
) -> None:
    data = image_bytes("JPEG", (320, 240), seed=71)
    first = await picture_turn(client, data)
    accepted, view = await follow_up(client, first["session_id"])
    assert accepted["status"] == "waiting", accepted  # handed to inference by the gateway itself
    assert view["status"] == "done", view
    spec, fields = record(service_stack, view["id"])
    assert view["final_text"] == reference.answer(spec.spec, data)
    assert fields["decode_skipped"] == "1" and "decode_started_at" not in fields  # no decode task ran
    assert view["timings"]["decode"] == 0.0 and fields["attempt"] == "1"
    for _ in range(50):  # the worker's next heartbeat reports the hit
        if await image_input_hits(client) > 0:
            break
        await asyncio.sleep(0.2)
    assert await image_input_hits(client) > 0


async def image_input_hits(client: httpx.AsyncClient) -> float:
    return await metric(client, "vlmq_cache_hits_total{", 'cache="image_input"')


async def metric(client: httpx.AsyncClient, family: str, label: str = "") -> float:
    """The sum of a family's samples (``family``: its name and ``{``) whose labels contain ``label``."""
    lines = (await client.get("/metrics")).text.splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(family) and label in line)


async def test_a_picture_sent_before_is_not_decoded_again(
    client: httpx.AsyncClient, service_stack: ServiceStack, reference: Reference
) -> None:
    data = image_bytes("JPEG", (260, 300), seed=75)
    first = await picture_turn(client, data)
    assert "decode_skipped" not in record(service_stack, first["id"])[1]  # new: decoded
    again = await picture_turn(client, data, "How many shapes are there?")  # a new conversation
    spec, fields = record(service_stack, again["id"])
    assert again["session_id"] != first["session_id"]
    assert fields["decode_skipped"] == "1" and "decode_started_at" not in fields
    assert again["final_text"] == reference.answer(spec.spec, data)


async def test_an_openai_follow_up_streamed_skips_decoding_too(
    service_stack: ServiceStack, reference: Reference
) -> None:
    """The OpenAI route carries the whole history, the picture's bytes included: its follow-up is
    still served from the images the session's worker holds."""
    data = image_bytes("JPEG", (300, 220), seed=74)
    url = "data:image/jpeg;base64," + base64.b64encode(data).decode()
    picture = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "Describe it."}]
    messages: Any = [{"role": "user", "content": picture}]
    model = service_stack.settings.model_name
    async with openai.AsyncOpenAI(base_url=f"{service_stack.base_url}/v1", api_key="sk-none") as oai:
        first = await oai.chat.completions.create(
            model=model, messages=messages, max_tokens=8, user="fu-openai", extra_headers=NO_CACHE
        )
        answer = first.choices[0].message.content or ""
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "Why?"}]
        stream: Any = await oai.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=8,
            stream=True,
            user="fu-openai",
            extra_headers=NO_CACHE,
        )
        chunks = [c async for c in stream]
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    spec, fields = record(service_stack, chunks[0].id.removeprefix("chatcmpl-"))
    assert streamed == reference.answer(spec.spec, data)
    assert fields["decode_skipped"] == "1" and "decode_started_at" not in fields


async def test_a_restarted_worker_sends_the_turn_back_to_decoding(
    stack_factory: Callable[..., ServiceStack], reference: Reference
) -> None:
    """The session's worker restarts (same id, so still its owner) and holds no images: the follow-up
    handed to it goes back to decoding, and the answer is the same; the next one goes straight to it
    (it holds the picture again)."""
    stack = stack_factory()
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=60) as client:
        data = image_bytes("PNG", (200, 260), seed=72)
        first = await picture_turn(client, data)
        stack.restart("inference")
        accepted, view = await follow_up(client, first["session_id"])
        assert accepted["status"] == "waiting", accepted
        assert view["status"] == "done", view
        spec, fields = record(stack, view["id"])
        assert view["final_text"] == reference.answer(spec.spec, data)
        assert "decode_skipped" not in fields and "decode_started_at" in fields  # decoded after all
        assert fields["attempt"] == "2" and fields["returned"] == "1"  # the first one found no images
        for _ in range(50):  # the worker's next heartbeat reports the return
            if await metric(client, "vlmq_image_inputs_returned_total{") > 0:
                break
            await asyncio.sleep(0.2)
        assert await metric(client, "vlmq_image_inputs_returned_total{") == 1
        _, again = await follow_up(client, first["session_id"])  # decoded once more: held again
        fields = record(stack, again["id"])[1]
        assert fields["decode_skipped"] == "1" and fields["attempt"] == "1" and "returned" not in fields
    assert stack.redis.llen(stack.keys.decode_queue()) == 0  # its one decode task ran, nothing left
    assert not stack.redis.exists(stack.keys.job_pixels(view["id"]))


async def test_a_worker_that_keeps_no_images_gets_every_job_decoded(
    stack_factory: Callable[..., ServiceStack],
) -> None:
    stack = stack_factory(extra_env={"VLMQ_IMAGE_INPUT_CACHE_MB": "0"})
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=60) as client:
        first = await picture_turn(client, image_bytes("JPEG", (180, 140), seed=76))
        accepted, view = await follow_up(client, first["session_id"])
    assert accepted["status"] == "queued" and view["status"] == "done", (accepted, view)
    assert "decode_started_at" in record(stack, view["id"])[1]


ONE_PICTURE_MB = "0.1"  # the bundled model's picture is kept as 168 x 168 x 3 bytes (85 KB): it holds one


@pytest.fixture(scope="module")
def tenants_stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceStack]:
    """Two tenants, and an inference worker whose decoded-image cache holds one picture."""
    folder = tmp_path_factory.mktemp("tenants")
    (folder / "keys").write_text("key-acme tenant=acme\nkey-rival tenant=rival\n")
    env = {"VLMQ_API_KEYS_FILE": str(folder / "keys"), "VLMQ_IMAGE_INPUT_CACHE_MB": ONE_PICTURE_MB}
    with running(ServiceStack(redis_url, Path(folder), extra_env=env)) as stack:
        yield stack


def tenant_client(stack: ServiceStack, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=stack.base_url, timeout=60, headers={"Authorization": f"Bearer {key}"})


async def test_a_picture_skips_decoding_only_for_the_tenant_that_sent_it(tenants_stack: ServiceStack) -> None:
    """Another tenant's 202 must not say ``waiting`` for a picture it never sent: that would tell it
    someone else did (tenants share no cached results by default)."""
    data = image_bytes("JPEG", (210, 170), seed=77)
    async with (
        tenant_client(tenants_stack, "key-acme") as acme,
        tenant_client(tenants_stack, "key-rival") as rival,
    ):
        await picture_turn(acme, data)
        again = await picture_turn(acme, data, "How many shapes are there?")
        other = await picture_turn(rival, data, "How many shapes are there?")
    assert record(tenants_stack, again["id"])[1].get("decode_skipped") == "1"
    fields = record(tenants_stack, other["id"])[1]
    assert "decode_skipped" not in fields and "decode_started_at" in fields
    assert other["final_text"] == again["final_text"]


async def test_a_follow_up_whose_pictures_were_evicted_is_decoded_not_bounced(
    tenants_stack: ServiceStack, reference: Reference
) -> None:
    """A second picture in the conversation evicts the first from a cache that holds one: the
    follow-up is decoded at once, not handed to the worker only to come back (``returned``)."""
    first, second = image_bytes("JPEG", (320, 240), seed=78), image_bytes("JPEG", (240, 320), seed=79)
    async with tenant_client(tenants_stack, "key-acme") as acme:
        view = await picture_turn(acme, first)
        sid = view["session_id"]
        form = {"prompt": "And this one?", "session_id": sid, "max_tokens": "8"}
        files = {"image": ("j.jpg", second, "image/jpeg")}
        resp = await acme.post("/v1/jobs", data=form, files=files, headers=NO_CACHE)
        assert (await wait_done(acme, resp.json()["id"]))["status"] == "done"
        accepted, done = await follow_up(acme, sid)
    assert accepted["status"] == "queued" and done["status"] == "done", (accepted, done)
    spec, fields = record(tenants_stack, done["id"])
    assert "returned" not in fields and "decode_skipped" not in fields and fields["attempt"] == "1"
    assert done["final_text"] == reference.answer(spec.spec, [first, second])
