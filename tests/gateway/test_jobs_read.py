"""GET / DELETE /v1/jobs/{id} and /v1/sessions/{id}, with worker progress written into Redis."""

from __future__ import annotations

from typing import Any

import httpx
import redis

from shared.schemas import JobEvent, JobStatus
from tests.gateway.workerside import emit_token, finish_done, finish_failed, run_job, set_status
from tests.support.jobs import image_bytes
from tests.support.stack import ServiceStack

JPEG = image_bytes("JPEG", (128, 96), seed=5)


async def new_job(client: httpx.AsyncClient, **fields: object) -> dict[str, object]:
    form = {"prompt": "What colour?", **{k: str(v) for k, v in fields.items()}}
    resp = await client.post(
        "/v1/jobs",
        data=form,
        files={"image": ("a.jpg", JPEG, "image/jpeg")},
        headers={"Cache-Control": "no-cache"},
    )
    assert resp.status_code == 202, resp.text
    return resp.json()


async def test_poll_follows_progress(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis
) -> None:
    keys = gateway.keys
    job_id = str((await new_job(client))["id"])
    view = (await client.get(f"/v1/jobs/{job_id}")).json()
    assert view["status"] == "queued" and view["text"] == "" and view["final_text"] is None

    set_status(r, keys, job_id, JobStatus.DECODING)
    set_status(r, keys, job_id, JobStatus.WAITING)
    set_status(r, keys, job_id, JobStatus.GENERATING)
    emit_token(r, keys, job_id, "A red", 0)
    emit_token(r, keys, job_id, " square", 1)
    view = (await client.get(f"/v1/jobs/{job_id}")).json()
    assert view["status"] == "generating" and view["text"] == "A red square"

    finish_done(r, keys, job_id, "A red square.", completion_tokens=3)
    view = (await client.get(f"/v1/jobs/{job_id}")).json()
    assert view["status"] == "done" and view["text"] == view["final_text"] == "A red square."
    assert view["finish_reason"] == "stop"
    assert view["usage"] == {
        "prompt_tokens": 120,
        "completion_tokens": 3,
        "cached_tokens": 100,
        "total_tokens": 123,
    }
    assert set(view["timings"]) == {
        "queue",
        "decode",
        "wait",
        "vision",
        "prefill",
        "generation",
        "ttft",
        "total",
    }
    assert view["timings"]["ttft"] == 0.04


async def test_text_so_far_never_repeats_a_retried_attempts_tokens(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis
) -> None:
    keys = gateway.keys
    job_id = str((await new_job(client))["id"])
    set_status(r, keys, job_id, JobStatus.GENERATING)
    emit_token(r, keys, job_id, "one", 0)
    emit_token(r, keys, job_id, " two", 1)
    # Attempt 1 died; attempt 2 regenerates and (even if it re-sent) index 1 must not repeat.
    emit_token(r, keys, job_id, " two", 1, attempt=2)
    emit_token(r, keys, job_id, " three", 2, attempt=2)
    assert (await client.get(f"/v1/jobs/{job_id}")).json()["text"] == "one two three"


async def test_failed_job_reports_error(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis
) -> None:
    job_id = str((await new_job(client))["id"])
    finish_failed(r, gateway.keys, job_id, "image could not be decoded: truncated JPEG")
    view = (await client.get(f"/v1/jobs/{job_id}")).json()
    assert view["status"] == "failed" and "truncated JPEG" in view["error"]


async def test_unknown_ids_are_404(client: httpx.AsyncClient) -> None:
    for method, path in [
        ("GET", "/v1/jobs/nope"),
        ("DELETE", "/v1/jobs/nope"),
        ("GET", "/v1/jobs/nope/events"),
        ("GET", "/v1/sessions/nope"),
        ("DELETE", "/v1/sessions/nope"),
    ]:
        resp = await client.request(method, path)
        assert resp.status_code == 404, (method, path, resp.text)
        assert "not found" in resp.json()["error"]["message"]
        assert resp.json()["error"]["type"] == "not_found_error"


async def test_cancel_queued_job(client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis) -> None:
    keys = gateway.keys
    job_id = str((await new_job(client))["id"])
    resp = await client.delete(f"/v1/jobs/{job_id}")
    assert resp.status_code == 200 and resp.json()["status"] == "cancelled"
    assert r.get(keys.job_cancel(job_id)) == b"1"
    newest: Any = r.xrevrange(keys.job_events(job_id), count=1)
    last = JobEvent.from_fields(newest[0][1])
    assert last.type == "status" and last.status == JobStatus.CANCELLED
    # Idempotent; and a worker's later FINISH is refused (terminal written once).
    assert (await client.delete(f"/v1/jobs/{job_id}")).status_code == 200
    assert not finish_done(r, keys, job_id, "late")
    assert (await client.get(f"/v1/jobs/{job_id}")).json()["status"] == "cancelled"


async def test_cancel_generating_job_sets_flag_only(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis
) -> None:
    keys = gateway.keys
    job_id = str((await new_job(client))["id"])
    set_status(r, keys, job_id, JobStatus.GENERATING)
    resp = await client.delete(f"/v1/jobs/{job_id}")
    assert resp.status_code == 202 and resp.json()["status"] == "generating"
    assert r.get(keys.job_cancel(job_id)) == b"1"


async def test_cancel_done_job_is_409(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis
) -> None:
    job_id = str((await new_job(client))["id"])
    run_job(r, gateway.keys, job_id, ["Blue", "."])
    resp = await client.delete(f"/v1/jobs/{job_id}")
    assert resp.status_code == 409 and "already finished" in resp.json()["error"]["message"]


async def test_session_delete(client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis) -> None:
    sid = str((await new_job(client, session_id="to-delete"))["session_id"])
    got = (await client.get(f"/v1/sessions/{sid}")).json()
    assert got["id"] == sid and got["turns"] == [] and got["image_format"] == "JPEG"
    assert (await client.delete(f"/v1/sessions/{sid}")).status_code == 204
    assert not r.exists(gateway.keys.conversation(sid))
    assert (await client.get(f"/v1/sessions/{sid}")).status_code == 404
