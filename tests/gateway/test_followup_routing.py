"""A job whose pictures a live worker holds decoded (a follow-up, or a picture sent before): the
gateway hands it straight to that worker, without a decode task, while every live worker keeps
decoded images; otherwise (nobody holds them, or a worker of a release that does not keep them is
alive: a rolling upgrade) it is decoded as before. Workers play their part here from the test
(heartbeats and owner records written directly)."""

from __future__ import annotations

import time

import httpx
import redis

from shared import workers
from shared.jobs import JobRecord
from shared.keys import Keys
from tests.gateway.workerside import decode_tasks, record_turn, stream_jobs
from tests.support.jobs import image_bytes
from tests.support.stack import ServiceStack


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


async def test_a_job_skips_decoding_only_while_a_live_worker_holds_its_pictures(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis
) -> None:
    keys = gateway.keys
    picture = image_bytes("PNG", (64, 64), seed=81)
    files = {"image": ("i.png", picture, "image/png")}
    first = (await client.post("/v1/jobs", data={"prompt": "What is it?"}, files=files)).json()
    sid, spec = first["session_id"], JobRecord.from_hash(r.hgetall(keys.job(first["id"]))).spec
    assert spec.image_digest is not None
    assert record_turn(r, keys, spec, "A square.")
    held = keys.image_input_owner("", spec.image_digest)  # an open gateway: no tenant
    r.set(keys.session_owner(sid), "w-new")
    r.set(held, "w-new")
    beat(r, keys, "w-new", keeps_images=True)
    try:
        direct = await follow_up(client, sid)
        assert direct["status"] == "waiting", direct
        assert direct["id"] in stream_jobs(r, keys.worker_stream("w-new"))
        assert direct["id"] not in decode_tasks(r, gateway.key_prefix)
        assert r.hget(keys.job(direct["id"]), "decode_skipped") == b"1"
        again = (await client.post("/v1/jobs", data={"prompt": "Its colour?"}, files=files)).json()
        assert again["status"] == "waiting" and again["session_id"] != sid, again  # sent before

        r.delete(held)  # the worker dropped the picture (evicted): decoded again
        assert_decoded(r, gateway, await follow_up(client, sid))
        r.set(held, "w-new")
        beat(r, keys, "w-old", keeps_images=False)  # a worker of the previous release joins
        assert_decoded(r, gateway, await follow_up(client, sid))
    finally:
        withdraw(r, keys, "w-new", "w-old")  # their heartbeat keys would outlive this test


def assert_decoded(r: redis.Redis, gateway: ServiceStack, accepted: dict[str, str]) -> None:
    assert accepted["status"] == "queued", accepted
    assert accepted["id"] in decode_tasks(r, gateway.key_prefix)
    assert not r.hexists(gateway.keys.job(accepted["id"]), "decode_skipped")
