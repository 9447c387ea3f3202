"""How jobs end as the gateway sees them: lazy expiry, error codes for OpenAI clients, outcome
metrics, /readyz and worker shutdown, the chat socket's cancel under load, enqueue failures."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import openai
import pytest
import redis
from websockets.asyncio.client import connect

from shared import metrics_hash, workers
from tests.gateway.clients import read_sse
from tests.gateway.conftest import GATEWAY_ENV
from tests.gateway.test_health_metrics import heartbeat, register
from tests.gateway.workerside import decode_tasks, finish_failed, record_turn
from tests.support.jobs import image_bytes
from tests.support.stack import ServiceStack

PNG = image_bytes("PNG", (72, 60), seed=51)
DATA_URL = "data:image/png;base64," + base64.b64encode(PNG).decode()


async def submit(client: httpx.AsyncClient, **fields: object) -> dict[str, Any]:
    form = {"prompt": "What colour?", **{k: str(v) for k, v in fields.items()}}
    files = {"image": ("a.png", PNG, "image/png")}
    resp = await client.post("/v1/jobs", data=form, files=files, headers={"Cache-Control": "no-cache"})
    assert resp.status_code == 202, resp.text
    return dict(resp.json())


def outcomes(r: redis.Redis, stack: ServiceStack, outcome: str) -> int:
    raw = r.hget(stack.keys.metrics_counters(), metrics_hash.series("jobs_total", outcome=outcome))
    return int(raw or 0)


async def test_past_deadline_job_is_expired_when_polled(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis
) -> None:
    before = outcomes(r, gateway, "expired")
    job = await submit(client, timeout_s=0.3)
    await asyncio.sleep(0.5)  # no worker runs here: only the gateway can notice
    view = (await client.get(f"/v1/jobs/{job['id']}")).json()
    assert view["status"] == "expired" and view["error_code"] == "expired"
    assert outcomes(r, gateway, "expired") == before + 1


async def test_past_deadline_job_is_expired_for_a_stream_listener(
    client: httpx.AsyncClient, gateway: ServiceStack
) -> None:
    job = await submit(client, timeout_s=0.5)
    events = await asyncio.wait_for(read_sse(client, f"/v1/jobs/{job['id']}/events"), 10)
    assert events[-1]["event"] == "status" and events[-1]["data"]["status"] == "expired"


@pytest.fixture
async def oai(gateway: ServiceStack) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{gateway.base_url}/v1", api_key="sk-test", max_retries=0) as c:
        yield c


async def fail_next_job(r: redis.Redis, gateway: ServiceStack, code: str) -> None:
    seen = set(decode_tasks(r, gateway.key_prefix))
    while True:
        new = [j for j in decode_tasks(r, gateway.key_prefix) if j not in seen]
        if new:
            finish_failed(r, gateway.keys, new[0], "cannot identify image file", code)
            return
        await asyncio.sleep(0.02)


@pytest.mark.parametrize(("code", "http"), [("bad_image", 400), ("internal", 500)])
async def test_openai_errors_follow_the_error_code(
    oai: openai.AsyncOpenAI, gateway: ServiceStack, r: redis.Redis, code: str, http: int
) -> None:
    worker = asyncio.create_task(fail_next_job(r, gateway, code))
    turn: Any = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": DATA_URL}}]}
    with pytest.raises(openai.APIStatusError) as caught:
        await oai.chat.completions.create(model=gateway.settings.model_name, messages=[turn])
    await worker
    assert caught.value.status_code == http
    assert caught.value.body["code"] == code  # type: ignore[index]


async def next_job(r: redis.Redis, gateway: ServiceStack) -> str:
    seen = set(decode_tasks(r, gateway.key_prefix))
    while not (new := [j for j in decode_tasks(r, gateway.key_prefix) if j not in seen]):
        await asyncio.sleep(0.02)
    return new[0]


async def completion_waiting(
    oai: openai.AsyncOpenAI, gateway: ServiceStack, r: redis.Redis
) -> tuple[asyncio.Task[Any], str]:
    """A non-streamed completion of a picture, waiting on its job (no worker runs it): the call's
    task and the job's id."""
    job = asyncio.create_task(next_job(r, gateway))
    turn: Any = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": DATA_URL}}]}
    model = gateway.settings.model_name
    call = asyncio.create_task(oai.chat.completions.create(model=model, messages=[turn]))
    return call, await asyncio.wait_for(job, 10)


async def test_a_waiting_completion_answers_by_the_jobs_terminal_event(
    oai: openai.AsyncOpenAI, client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis
) -> None:
    """Cancelled through the jobs API while a non-streamed completion waits: that request gets
    the cancellation (its terminal status event), not a completion."""
    call, job_id = await completion_waiting(oai, gateway, r)
    assert (await client.delete(f"/v1/jobs/{job_id}")).status_code == 200
    with pytest.raises(openai.APIStatusError) as caught:
        await asyncio.wait_for(call, 10)
    assert caught.value.status_code == 499 and caught.value.body["code"] == "cancelled"  # type: ignore[index]


async def test_a_waiting_completion_whose_job_vanishes_is_not_found(
    oai: openai.AsyncOpenAI, gateway: ServiceStack, r: redis.Redis
) -> None:
    """The job's keys gone while a non-streamed completion waits (Redis evicted or flushed them):
    the stream ends with no terminal event, and the answer is the record's absence (404)."""
    call, job_id = await completion_waiting(oai, gateway, r)
    r.delete(gateway.keys.job(job_id), gateway.keys.job_events(job_id))
    with pytest.raises(openai.APIStatusError) as caught:
        await asyncio.wait_for(call, 10)
    assert caught.value.status_code == 404 and caught.value.body["code"] == "job_not_found"  # type: ignore[index]


async def test_cancel_before_start_and_cache_hits_are_counted(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis
) -> None:
    cancelled = outcomes(r, gateway, "cancelled")
    job = await submit(client)
    assert (await client.delete(f"/v1/jobs/{job['id']}")).status_code == 200
    assert outcomes(r, gateway, "cancelled") == cancelled + 1


async def test_inference_depth_is_the_stream_length(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis
) -> None:
    stream = gateway.keys.inference_stream()
    r.delete(stream)
    r.xgroup_create(stream, "inference", id="0", mkstream=True)
    ids = [r.xadd(stream, {"job_id": f"j{i}"}) for i in range(3)]
    r.xreadgroup("inference", "w", {stream: ">"}, count=3)
    r.xack(stream, "inference", ids[0])
    r.xdel(stream, ids[0])  # workers delete acknowledged entries: the group's lag becomes unknown
    text = (await client.get("/metrics")).text
    r.delete(stream)
    assert 'vlmq_queue_depth{queue="inference"} 2.0' in text


async def test_a_stopping_worker_is_not_ready(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis
) -> None:
    beat = {**json.loads(heartbeat("w-stop")), "stopping": True}
    register(r, gateway.keys, json.dumps(beat))
    try:
        resp = await client.get("/readyz")
    finally:
        pipe = r.pipeline()
        workers.withdraw(pipe, gateway.keys, "w-stop")
        pipe.execute()
    assert resp.status_code == 503 and "shutting down" in " ".join(resp.json()["reasons"])


async def test_cancel_is_read_while_the_submission_queue_is_full(
    gateway: ServiceStack, r: redis.Redis
) -> None:
    async with connect(f"{gateway.ws_url}/v1/chat/ws") as ws:
        await ws.send(json.dumps({"prompt": "First?", "image": DATA_URL, "use_cache": False}))
        first = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert first["type"] == "accepted"
        for i in range(20):  # more than the connection queues: the reader must not block
            await ws.send(json.dumps({"prompt": f"later {i}?", "session_id": first["session_id"]}))
        await ws.send(json.dumps({"type": "cancel"}))
        seen: list[dict[str, Any]] = []
        while not any(m.get("status") == "cancelled" for m in seen):
            seen.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
    assert any(m.get("code") == "too_many_pending" for m in seen)
    assert r.hget(gateway.keys.job(first["id"]), "status") == b"cancelled"


async def test_failed_enqueue_leaves_the_session_alone_and_fails_the_job(
    stack_factory: Callable[..., ServiceStack],
) -> None:
    gw = stack_factory(components=("gateway",), extra_env=GATEWAY_ENV)
    r = gw.redis
    async with httpx.AsyncClient(base_url=gw.base_url, timeout=20) as client:
        first = await submit(client, session_id="keep-me", system="Be brief.")
        spec_first = _spec(r, gw, first["id"])
        assert record_turn(r, gw.keys, spec_first, "Red.")
        session_before = r.hgetall(gw.keys.conversation("keep-me"))
        r.execute_command("ACL", "SETUSER", "default", "-lpush")  # the broker refuses every send
        other = image_bytes("JPEG", (50, 50), seed=52)  # a new image would restart the session
        files = {"image": ("b.jpg", other, "image/jpeg")}
        try:
            resp = await client.post(
                "/v1/jobs", data={"prompt": "New?", "session_id": "keep-me"}, files=files
            )
        finally:
            r.execute_command("ACL", "SETUSER", "default", "+lpush")
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "queue_unavailable"
    assert r.hgetall(gw.keys.conversation("keep-me")) == session_before
    jobs = [k for k in r.scan_iter(match=f"{gw.key_prefix}:job:*", _type="hash")]
    failed = [k for k in jobs if r.hget(k, "status") == b"failed"]
    assert len(failed) == 1 and r.hget(failed[0], "error_code") == b"queue_unavailable"
    assert outcomes(r, gw, "failed") == 1


async def test_an_accepted_job_is_written_and_enqueued_in_one_multi(
    stack_factory: Callable[..., ServiceStack],
) -> None:
    """Image, record, decode task and conversation: one MULTI (one round trip), all of it there."""
    gw = stack_factory(components=("gateway",), extra_env=GATEWAY_ENV)
    r = gw.redis

    def execs() -> int:
        return int(r.info("commandstats").get("cmdstat_exec", {}).get("calls", 0))

    async with httpx.AsyncClient(base_url=gw.base_url, timeout=20) as client:
        await submit(client, session_id="warm-up")  # the first request's own set-up aside
        before = execs()
        job = await submit(client, session_id="one-multi")
        after = execs()
    assert after - before == 1
    assert r.hget(gw.keys.job(job["id"]), "status") == b"queued"
    assert r.exists(gw.keys.conversation("one-multi"))
    assert job["id"] in decode_tasks(r, gw.key_prefix)


def _spec(r: redis.Redis, stack: ServiceStack, job_id: str) -> Any:
    from shared.jobs import JobRecord

    return JobRecord.from_hash(r.hgetall(stack.keys.job(job_id))).spec
