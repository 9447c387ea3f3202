"""POST /v1/jobs: what an accepted job leaves in Redis (contract §1) and the 202 it answers."""

from __future__ import annotations

import base64
import hashlib
import time
from typing import Any

import httpx
import redis

from shared.jobs import JobRecord
from shared.schemas import JobEvent, JobStatus
from tests.gateway.workerside import decode_tasks, record_turn
from tests.support.jobs import image_bytes
from tests.support.stack import ServiceStack

JPEG = image_bytes("JPEG", (320, 240), seed=1)


async def submit(client: httpx.AsyncClient, data: bytes = JPEG, **fields: object) -> httpx.Response:
    form = {k: str(v) for k, v in fields.items()}
    return await client.post("/v1/jobs", data=form, files={"image": ("photo.jpg", data, "image/jpeg")})


async def test_multipart_job_is_accepted_and_stored(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis
) -> None:
    keys = gateway.keys
    resp = await submit(client, prompt="What colour is the square?", max_tokens=12, timeout_s=30)
    assert resp.status_code == 202, resp.text
    body = resp.json()
    job_id = body["id"]
    assert body["status"] == "queued" and body["session_id"]
    assert body["status_url"].endswith(f"/v1/jobs/{job_id}")
    assert body["events_url"].endswith(f"/v1/jobs/{job_id}/events")
    assert body["stream_url"].startswith("ws://") and body["stream_url"].endswith(f"/v1/jobs/{job_id}/stream")
    assert resp.headers["location"] == body["status_url"]

    record = JobRecord.from_hash(r.hgetall(keys.job(job_id)))
    assert record.status == JobStatus.QUEUED
    spec = record.spec
    digest = hashlib.sha256(JPEG).hexdigest()
    assert spec.image_digest == digest and spec.image_format == "JPEG"
    assert [(t.role, t.text, t.image) for t in spec.messages] == [
        ("user", "What colour is the square?", True)
    ]
    assert spec.sampling.max_tokens == 12 and spec.sampling.temperature == 0.0
    assert spec.deadline is not None and abs(spec.deadline - (spec.created_at + 30)) < 1e-6
    assert 0 < r.ttl(keys.job(job_id)) <= gateway.settings.job_ttl_s
    assert r.get(keys.image(digest)) == JPEG
    assert 0 < r.ttl(keys.image(digest)) <= gateway.settings.image_ttl_s
    events: Any = r.xrange(keys.job_events(job_id))
    assert [JobEvent.from_fields(f).status for _, f in events] == [JobStatus.QUEUED]
    assert job_id in decode_tasks(r, gateway.key_prefix)
    session: Any = r.hgetall(keys.conversation(body["session_id"]))
    assert session[b"image_digest"].decode() == digest


async def test_json_body_with_base64_and_data_url(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis
) -> None:
    png = image_bytes("PNG", (200, 120), seed=2)
    b64 = base64.b64encode(png).decode()
    for image in (b64, f"data:image/png;base64,{b64}"):
        resp = await client.post(
            "/v1/jobs", json={"image": image, "prompt": "How many squares?", "stop": "\n"}
        )
        assert resp.status_code == 202, resp.text
        spec = JobRecord.from_hash(r.hgetall(gateway.keys.job(resp.json()["id"]))).spec
        assert spec.image_format == "PNG" and spec.sampling.stop == ["\n"]
    # Stored once per digest, whatever the number of jobs.
    assert r.get(gateway.keys.image(hashlib.sha256(png).hexdigest())) == png


async def test_webp_accepted(client: httpx.AsyncClient) -> None:
    resp = await submit(client, image_bytes("WEBP", (64, 64)), prompt="Describe")
    assert resp.status_code == 202, resp.text


async def test_sampling_without_seed_gets_one(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis
) -> None:
    resp = await submit(client, prompt="Say something", temperature=0.7, top_p=0.9, top_k=20)
    spec = JobRecord.from_hash(r.hgetall(gateway.keys.job(resp.json()["id"]))).spec
    assert spec.sampling.seed is not None and spec.sampling.temperature == 0.7 and spec.sampling.top_k == 20
    greedy = await submit(client, prompt="Say something")
    assert JobRecord.from_hash(r.hgetall(gateway.keys.job(greedy.json()["id"]))).spec.sampling.seed is None


async def test_min_tokens_and_ignore_eos_reach_the_spec(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis
) -> None:
    resp = await submit(client, prompt="Say more", max_tokens=200, min_tokens=150, ignore_eos="true")
    assert resp.status_code == 202, resp.text
    sampling = JobRecord.from_hash(r.hgetall(gateway.keys.job(resp.json()["id"]))).spec.sampling
    assert (sampling.max_tokens, sampling.min_tokens, sampling.ignore_eos) == (200, 150, True)
    plain = JobRecord.from_hash(r.hgetall(gateway.keys.job((await submit(client, prompt="x")).json()["id"])))
    assert (plain.spec.sampling.min_tokens, plain.spec.sampling.ignore_eos) == (0, False)


async def test_session_turn_without_image_uses_session_image(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis
) -> None:
    first = (await submit(client, prompt="What colour is the square?", system="Be brief.")).json()
    sid = first["session_id"]
    spec1 = JobRecord.from_hash(r.hgetall(gateway.keys.job(first["id"]))).spec
    assert record_turn(r, gateway.keys, spec1, "Red.")  # what the worker does on done
    resp = await client.post("/v1/jobs", json={"prompt": "And the circle?", "session_id": sid})
    assert resp.status_code == 202, resp.text
    assert resp.json()["session_id"] == sid
    spec2 = JobRecord.from_hash(r.hgetall(gateway.keys.job(resp.json()["id"]))).spec
    assert spec2.image_digest == spec1.image_digest and spec2.conversation_id == sid
    assert [(t.role, t.text, t.image) for t in spec2.messages] == [
        ("system", "Be brief.", False),
        ("user", "What colour is the square?", True),
        ("assistant", "Red.", False),
        ("user", "And the circle?", False),
    ]
    view = (await client.get(f"/v1/sessions/{sid}")).json()
    assert view["image_digest"] == spec1.image_digest and len(view["turns"]) == 3


async def test_named_session_is_created(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis
) -> None:
    resp = await submit(client, prompt="Hi", session_id="my-session-1")
    assert resp.status_code == 202 and resp.json()["session_id"] == "my-session-1"
    assert r.exists(gateway.keys.conversation("my-session-1"))
    assert 0 < r.ttl(gateway.keys.conversation("my-session-1")) <= gateway.settings.session_ttl_s


async def test_authorization_header_is_harmless(client: httpx.AsyncClient) -> None:
    headers = {"Authorization": "Bearer sk-anything"}
    form = {"prompt": "Hi"}
    files = {"image": ("a.jpg", JPEG, "image/jpeg")}
    assert (await client.post("/v1/jobs", data=form, files=files, headers=headers)).status_code == 202
    assert (await client.get("/healthz", headers=headers)).status_code == 200
    assert (await client.get("/v1/models", headers=headers)).status_code == 200


async def test_accept_is_fast(client: httpx.AsyncClient) -> None:
    start = time.perf_counter()
    for _ in range(10):
        assert (await submit(client, prompt="Quick?")).status_code == 202
    assert (time.perf_counter() - start) / 10 < 0.25


async def test_a_new_image_joins_the_session(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis
) -> None:
    """A follow-up with another image adds it: the new turn shows it, the earlier turns stay."""
    first = await submit(client, prompt="What colour?", session_id="switch-1")
    spec1 = JobRecord.from_hash(r.hgetall(gateway.keys.job(first.json()["id"]))).spec
    assert record_turn(r, gateway.keys, spec1, "Red.")
    other = image_bytes("PNG", (90, 90), seed=77)
    resp = await submit(client, other, prompt="And now?", session_id="switch-1")
    spec2 = JobRecord.from_hash(r.hgetall(gateway.keys.job(resp.json()["id"]))).spec
    new = hashlib.sha256(other).hexdigest()
    assert spec2.image_digest == spec1.image_digest and spec2.image_digests() == [spec1.image_digest, new]
    assert [(t.role, t.text, t.images) for t in spec2.messages] == [
        ("user", "What colour?", [spec1.image_digest]),
        ("assistant", "Red.", []),
        ("user", "And now?", [new]),
    ]
    assert r.get(gateway.keys.image(new)) == other
    session = (await client.get("/v1/sessions/switch-1")).json()
    assert session["image_digest"] == spec1.image_digest and len(session["turns"]) == 2


async def test_a_follow_up_may_be_a_plain_urlencoded_form(client: httpx.AsyncClient) -> None:
    """A question in a session needs no file: a browser form or ``curl -d`` is enough."""
    files = {"image": ("a.jpg", JPEG, "image/jpeg")}
    first = (await client.post("/v1/jobs", data={"prompt": "Colour?"}, files=files)).json()
    resp = await client.post("/v1/jobs", data={"prompt": "Size?", "session_id": first["session_id"]})
    assert resp.request.headers["content-type"] == "application/x-www-form-urlencoded"
    assert resp.status_code == 202, resp.text
    assert resp.json()["session_id"] == first["session_id"]
