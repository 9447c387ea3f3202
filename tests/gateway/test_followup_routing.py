"""A follow-up that shows no new image: the gateway hands it straight to its session's live owner,
without a decode task, while every live worker keeps decoded images; while a worker of a release
that does not is alive (a rolling upgrade), it is decoded as before. Workers play their part here
from the test (heartbeats and owner records written directly)."""

from __future__ import annotations

import asyncio
import time

import httpx
import redis

from shared import workers
from shared.jobs import JobRecord
from shared.keys import Keys
from tests.gateway.workerside import decode_tasks, record_turn, stream_jobs
from tests.support.jobs import image_bytes
from tests.support.stack import ServiceStack

HOLDERS_REFRESH_S = 2.1  # gateway.image_holders reads the heartbeats at most every 2 s


def beat(r: redis.Redis, keys: Keys, worker_id: str, keeps_images: bool) -> None:
    stats = {"worker_id": worker_id, "ts": time.time(), **({"image_inputs": {}} if keeps_images else {})}
    pipe = r.pipeline()
    workers.publish(pipe, keys, stats, 20_000)
    pipe.execute()


def withdraw(r: redis.Redis, keys: Keys, *worker_ids: str) -> None:
    pipe = r.pipeline()
    for worker_id in worker_ids:
        workers.withdraw(pipe, keys, worker_id)
    pipe.execute()


async def follow_up(client: httpx.AsyncClient, session_id: str) -> dict[str, str]:
    resp = await client.post("/v1/jobs", json={"prompt": "And the circle?", "session_id": session_id})
    assert resp.status_code == 202, resp.text
    body: dict[str, str] = resp.json()
    return body


async def test_a_follow_up_skips_decoding_only_while_every_worker_keeps_images(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis
) -> None:
    keys = gateway.keys
    files = {"image": ("i.png", image_bytes("PNG", (64, 64), seed=81), "image/png")}
    first = (await client.post("/v1/jobs", data={"prompt": "What is it?"}, files=files)).json()
    sid = first["session_id"]
    assert record_turn(r, keys, JobRecord.from_hash(r.hgetall(keys.job(first["id"]))).spec, "A square.")
    r.set(keys.session_owner(sid), "w-new")
    beat(r, keys, "w-new", keeps_images=True)
    try:
        await asyncio.sleep(HOLDERS_REFRESH_S)
        direct = await follow_up(client, sid)
        assert direct["status"] == "waiting", direct
        assert direct["id"] in stream_jobs(r, keys.worker_stream("w-new"))
        assert direct["id"] not in decode_tasks(r, gateway.key_prefix)
        assert r.hget(keys.job(direct["id"]), "decode_skipped") == b"1"

        beat(r, keys, "w-old", keeps_images=False)  # a worker of the previous release joins
        await asyncio.sleep(HOLDERS_REFRESH_S)
        decoded = await follow_up(client, sid)
        assert decoded["status"] == "queued", decoded
        assert decoded["id"] in decode_tasks(r, gateway.key_prefix)
        assert not r.hexists(keys.job(decoded["id"]), "decode_skipped")
    finally:
        withdraw(r, keys, "w-new", "w-old")  # their heartbeat keys would outlive this test
