"""SSE and WebSocket event streams: ids are stream entry ids, resumable, exactly once."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import redis

from shared.schemas import JobStatus
from tests.gateway.clients import read_sse, read_ws, token_text
from tests.gateway.workerside import emit_token, finish_done, run_job, set_status
from tests.support.jobs import image_bytes
from tests.support.stack import ServiceStack

JPEG = image_bytes("JPEG", (96, 96), seed=9)
PIECES = ["The", " square", " is", " red", "."]


async def new_job(client: httpx.AsyncClient) -> str:
    resp = await client.post(
        "/v1/jobs",
        data={"prompt": "Colour?"},
        files={"image": ("a.jpg", JPEG, "image/jpeg")},
        headers={"Cache-Control": "no-cache"},
    )
    assert resp.status_code == 202, resp.text
    return str(resp.json()["id"])


def sse_data(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for e in events:
        data: Any = e["data"]
        assert isinstance(data, dict) and data["id"] == e["id"] and data["type"] == e["event"]
        out.append(data)
    return out


async def test_sse_replays_whole_stream(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis
) -> None:
    job_id = await new_job(client)
    token_ids = run_job(r, gateway.keys, job_id, PIECES)
    events = sse_data(await read_sse(client, f"/v1/jobs/{job_id}/events"))
    assert [e["type"] for e in events] == ["status", "status"] + ["token"] * 5 + ["done"]
    assert [e["id"] for e in events if e["type"] == "token"] == token_ids
    assert token_text(events) == "The square is red." == events[-1]["final_text"]
    assert events[-1]["usage"]["completion_tokens"] == 5 and "ttft" in events[-1]["timings"]


@pytest.mark.parametrize("how", ["header", "query"])
async def test_sse_resume_no_gap_no_duplicate(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis, how: str
) -> None:
    job_id = await new_job(client)
    token_ids = run_job(r, gateway.keys, job_id, PIECES)
    url, headers = f"/v1/jobs/{job_id}/events", {}
    if how == "header":
        headers["Last-Event-ID"] = token_ids[1]
    else:
        url += f"?last_event_id={token_ids[1]}"
    events = sse_data(await read_sse(client, url, headers=headers))
    assert [e["id"] for e in events if e["type"] == "token"] == token_ids[2:]
    assert "".join(PIECES[:2]) + token_text(events) == "The square is red."


async def test_sse_live_and_resumed_after_drop(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis
) -> None:
    """Tokens written while the client listens; the client drops after 2 tokens and resumes."""
    keys = gateway.keys
    job_id = await new_job(client)
    set_status(r, keys, job_id, JobStatus.GENERATING)

    async def worker() -> None:
        for i, piece in enumerate(PIECES):
            await asyncio.sleep(0.05)
            emit_token(r, keys, job_id, piece, i)
        finish_done(r, keys, job_id, "".join(PIECES))

    task = asyncio.create_task(worker())
    first = sse_data(
        await read_sse(client, f"/v1/jobs/{job_id}/events", limit=4)
    )  # queued, generating, 2 tokens
    last_id = str(first[-1]["id"])
    rest = sse_data(await read_sse(client, f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": last_id}))
    await task
    assert token_text(first) + token_text(rest) == "The square is red."
    assert rest[-1]["type"] == "done"


async def test_resume_after_terminal_event_ends_at_once(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis
) -> None:
    job_id = await new_job(client)
    run_job(r, gateway.keys, job_id, PIECES)
    newest: Any = r.xrevrange(gateway.keys.job_events(job_id), count=1)
    done_id = newest[0][0].decode()
    events = await asyncio.wait_for(
        read_sse(client, f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": done_id}), 0.9
    )
    assert events == []


async def test_stream_skips_tokens_republished_by_retry(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis
) -> None:
    keys = gateway.keys
    job_id = await new_job(client)
    set_status(r, keys, job_id, JobStatus.GENERATING)
    emit_token(r, keys, job_id, "The", 0)
    emit_token(r, keys, job_id, " square", 1)
    emit_token(r, keys, job_id, " square", 1, attempt=2)  # must not show twice
    emit_token(r, keys, job_id, " is", 2, attempt=2)
    finish_done(r, keys, job_id, "The square is", attempt=2)
    events = sse_data(await read_sse(client, f"/v1/jobs/{job_id}/events"))
    assert token_text(events) == "The square is"
    ws_events, _ = await read_ws(f"{gateway.ws_url}/v1/jobs/{job_id}/stream")
    assert token_text(ws_events) == "The square is"


async def test_bad_last_event_id(client: httpx.AsyncClient) -> None:
    job_id = await new_job(client)
    resp = await client.get(f"/v1/jobs/{job_id}/events?last_event_id=abc")
    assert resp.status_code == 400 and "last_event_id" in resp.json()["error"]["message"]


async def test_ws_replay_and_resume(client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis) -> None:
    job_id = await new_job(client)
    token_ids = run_job(r, gateway.keys, job_id, PIECES)
    url = f"{gateway.ws_url}/v1/jobs/{job_id}/stream"
    events, code = await read_ws(url)
    assert code == 1000 and events[-1]["type"] == "done"
    assert token_text(events) == "The square is red."
    assert [e["id"] for e in events if e["type"] == "token"] == token_ids
    resumed, _ = await read_ws(f"{url}?last_event_id={token_ids[2]}")
    assert [e["id"] for e in resumed if e["type"] == "token"] == token_ids[3:]


async def test_ws_live(client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis) -> None:
    keys = gateway.keys
    job_id = await new_job(client)
    reader = asyncio.create_task(read_ws(f"{gateway.ws_url}/v1/jobs/{job_id}/stream"))
    await asyncio.sleep(0.2)
    run_job(r, keys, job_id, PIECES)
    events, code = await asyncio.wait_for(reader, 10)
    assert token_text(events) == "The square is red." and code == 1000


async def test_ws_unknown_job(gateway: ServiceStack) -> None:
    events, code = await read_ws(f"{gateway.ws_url}/v1/jobs/nope/stream")
    assert code == 4404 and events[0]["type"] == "error" and "not found" in events[0]["error"]["message"]


async def test_cancelled_job_stream_ends(client: httpx.AsyncClient, gateway: ServiceStack) -> None:
    job_id = await new_job(client)
    reader = asyncio.create_task(read_sse(client, f"/v1/jobs/{job_id}/events"))
    await asyncio.sleep(0.2)
    assert (await client.delete(f"/v1/jobs/{job_id}")).status_code == 200
    events = sse_data(await asyncio.wait_for(reader, 5))
    assert events[-1]["type"] == "status" and events[-1]["status"] == "cancelled"
