"""Text-only jobs (no image anywhere in the conversation): accepted on every route, handed
straight to an inference stream by the gateway (no decode task, no image stored), routed like any
job (its session's owner, the batch stream), and stored conversations without an image."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import openai
import redis
from websockets.asyncio.client import connect

from shared import workers
from shared.jobs import JobRecord
from shared.schemas import JobEvent, JobStatus
from tests.gateway.workerside import decode_tasks, record_turn, run_job, stream_jobs
from tests.support.stack import ServiceStack


def spec_of(r: redis.Redis, gateway: ServiceStack, job_id: str) -> Any:
    return JobRecord.from_hash(r.hgetall(gateway.keys.job(job_id)))


async def test_a_text_only_job_goes_straight_to_inference(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis
) -> None:
    images_before = set(r.scan_iter(match=gateway.keys.image("*")))
    resp = await client.post("/v1/jobs", json={"prompt": "Say hello.", "max_tokens": 5})
    assert resp.status_code == 202, resp.text
    body = resp.json()
    job_id = body["id"]
    assert body["status"] == "waiting" and body["session_id"]
    record = spec_of(r, gateway, job_id)
    assert record.status == JobStatus.WAITING
    assert record.spec.image_digest is None
    assert [(t.role, t.text, t.image) for t in record.spec.messages] == [("user", "Say hello.", False)]
    assert job_id in stream_jobs(r, gateway.keys.inference_stream())
    assert job_id not in decode_tasks(r, gateway.key_prefix)
    assert set(r.scan_iter(match=gateway.keys.image("*"))) == images_before
    events: Any = r.xrange(gateway.keys.job_events(job_id))
    assert [JobEvent.from_fields(f).status for _, f in events] == [JobStatus.QUEUED, JobStatus.WAITING]
    view = (await client.get(f"/v1/sessions/{body['session_id']}")).json()
    assert view["image_digest"] is None and view["turns"] == []


async def test_a_text_only_conversation_continues_without_an_image(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis
) -> None:
    first = (await client.post("/v1/jobs", data={"prompt": "Hi.", "system": "Be brief."})).json()
    sid = first["session_id"]
    assert record_turn(r, gateway.keys, spec_of(r, gateway, first["id"]).spec, "Hello.")
    resp = await client.post("/v1/jobs", data={"prompt": "Again?", "session_id": sid})
    assert resp.status_code == 202, resp.text
    spec = spec_of(r, gateway, resp.json()["id"]).spec
    assert spec.image_digest is None and spec.conversation_id == sid
    assert [(t.role, t.text, t.image) for t in spec.messages] == [
        ("system", "Be brief.", False),
        ("user", "Hi.", False),
        ("assistant", "Hello.", False),
        ("user", "Again?", False),
    ]
    assert resp.json()["id"] in stream_jobs(r, gateway.keys.inference_stream())


async def test_a_text_only_turn_goes_to_its_sessions_live_owner(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis
) -> None:
    keys = gateway.keys
    first = (await client.post("/v1/jobs", json={"prompt": "One."})).json()
    sid = first["session_id"]
    assert record_turn(r, keys, spec_of(r, gateway, first["id"]).spec, "Two.")
    pipe = r.pipeline()
    workers.publish(pipe, keys, {"worker_id": "w-owner", "ts": time.time()}, 3000)
    pipe.set(keys.session_owner(sid), "w-owner")
    pipe.execute()
    resp = (await client.post("/v1/jobs", json={"prompt": "Three?", "session_id": sid})).json()
    pipe = r.pipeline()
    workers.withdraw(pipe, keys, "w-owner")  # its heartbeat key would expire under another test
    pipe.execute()
    assert resp["id"] in stream_jobs(r, keys.worker_stream("w-owner"))
    batch = (await client.post("/v1/jobs", json={"prompt": "Later.", "priority": "batch"})).json()
    assert batch["id"] in stream_jobs(r, keys.batch_stream())


async def test_text_only_over_the_websocket(gateway: ServiceStack, r: redis.Redis) -> None:
    async with connect(f"{gateway.ws_url}/v1/chat/ws") as ws:
        await ws.send(json.dumps({"prompt": "Hello?"}))
        accepted = json.loads(await ws.recv())
        assert accepted["type"] == "accepted" and accepted["status"] == "waiting", accepted
        assert accepted["id"] in stream_jobs(r, gateway.keys.inference_stream())
        run_job(r, gateway.keys, accepted["id"], ["Hi", "!"])
        texts = []
        while (event := json.loads(await ws.recv()))["type"] != "done":
            texts.append(event.get("text") or "")
        assert "".join(texts) == "Hi!"


async def test_text_only_openai_chat(gateway: ServiceStack, r: redis.Redis) -> None:
    """The official client, no image part: answered (the worker's part played from the stream)."""
    oai = openai.AsyncOpenAI(base_url=f"{gateway.base_url}/v1", api_key="sk-test", max_retries=0)
    keys = gateway.keys
    seen = set(stream_jobs(r, keys.inference_stream()))

    async def answer() -> None:
        while not (new := set(stream_jobs(r, keys.inference_stream())) - seen):
            await asyncio.sleep(0.02)
        run_job(r, keys, new.pop(), ["Hello", " there"])

    for stream in (False, True):
        worker = asyncio.create_task(answer())
        messages: Any = [{"role": "user", "content": "Greet me."}]
        if stream:
            chunks = await oai.chat.completions.create(model="vlmq-tiny", messages=messages, stream=True)
            text = "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
        else:
            resp = await oai.chat.completions.create(model="vlmq-tiny", messages=messages)
            text = resp.choices[0].message.content or ""
        await worker
        seen = set(stream_jobs(r, keys.inference_stream()))
        assert text == "Hello there"
    await oai.close()
