"""Issue 15's edge: every id, event id and body shape a client can get wrong is a clear 4xx in
OpenAI's error shape (WebSocket: an error event or a close code), never a 500, and stores nothing."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlencode

import httpx
import pytest
import redis
from websockets.asyncio.client import connect

from tests.gateway.clients import read_ws
from tests.gateway.conftest import stored_keys
from tests.gateway.workerside import finish_done
from tests.support.jobs import image_bytes
from tests.support.stack import ServiceStack, running
from tests.worker.images import animated, bad_images, mpo

JPEG = image_bytes("JPEG", (64, 64), seed=21)
DATA_URL = "data:image/jpeg;base64," + base64.b64encode(JPEG).decode()
BAD_JOB_IDS = [
    "nope",
    "0" * 31,
    "A" * 32,  # uppercase: never made by uuid4().hex
    "g" * 32,
    "0" * 33,
    "x" * 5000,
    "é" * 32,
    "%00",
]
BAD_EVENT_IDS = [
    "abc",
    "1-",
    "-1",
    "1-2-3",
    "18446744073709551616",  # 2**64: Redis says "Invalid stream ID"
    "1-18446744073709551616",
    "99999999999999999999999-0",
    "١٢٣-٠",  # Unicode digits pass Python's \d, not Redis
    "+1-0",
]


def error_of(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, (resp.status_code, resp.text)
    error = resp.json()["error"]
    assert error["message"] and error["type"], error
    return dict(error)


def lookups_of_missing_keys(r: redis.Redis) -> int:
    """Redis's keyspace misses: a lookup of an id that exists nowhere shows up here (streams other
    tests left open poll keys that exist: hits)."""
    stats: Any = r.info("stats")
    return int(stats["keyspace_misses"])


async def new_job(client: httpx.AsyncClient) -> str:
    files = {"image": ("a.jpg", JPEG, "image/jpeg")}
    resp = await client.post(
        "/v1/jobs", data={"prompt": "Colour?"}, files=files, headers={"Cache-Control": "no-cache"}
    )
    assert resp.status_code == 202, resp.text
    return str(resp.json()["id"])


# --- ids ---
@pytest.mark.parametrize("job_id", BAD_JOB_IDS)
async def test_malformed_job_ids_are_404_without_asking_redis(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis, job_id: str
) -> None:
    # The Redis server is the test session's: another stack's worker may miss a key meanwhile (a lock,
    # a heartbeat). A malformed id that reached Redis would miss in every round; noise does not.
    misses = []
    for _round in range(3):
        before = lookups_of_missing_keys(r)
        for method, suffix in [("GET", ""), ("DELETE", ""), ("GET", "/events")]:
            resp = await client.request(method, f"/v1/jobs/{job_id}{suffix}")
            error = error_of(resp, 404)
            assert error["type"] == "not_found_error" and error["code"] == "job_not_found", error
            assert len(error["message"]) < 200  # a long id is not echoed whole
        messages, code = await read_ws(f"{gateway.ws_url}/v1/jobs/{quote(job_id)}/stream")
        assert code == 4404 and messages[0]["error"]["code"] == "job_not_found"
        misses.append(lookups_of_missing_keys(r) - before)
        if misses[-1] == 0:
            break
    assert 0 in misses, f"a malformed id reached Redis: {misses} missed lookups in each round"


@pytest.mark.parametrize("session_id", ["bad id!", "x" * 129, "é", "a b"])
async def test_malformed_session_ids_are_404(client: httpx.AsyncClient, session_id: str) -> None:
    for method in ("GET", "DELETE"):
        error = error_of(await client.request(method, f"/v1/sessions/{session_id}"), 404)
        assert error["code"] == "session_not_found"


async def test_bad_event_ids_are_400_on_every_stream(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis
) -> None:
    job_id = await new_job(client)
    for bad in BAD_EVENT_IDS:
        error = error_of(await client.get(f"/v1/jobs/{job_id}/events", params={"last_event_id": bad}), 400)
        assert error["param"] == "last_event_id" and error["code"] == "bad_event_id", error
        resp = await client.get(f"/v1/jobs/{job_id}/events", headers={b"Last-Event-ID": bad.encode()})
        error_of(resp, 400)
        query = urlencode({"last_event_id": bad})
        messages, code = await read_ws(f"{gateway.ws_url}/v1/jobs/{job_id}/stream?{query}")
        assert code == 4400 and messages[0]["error"]["param"] == "last_event_id", (bad, messages)


async def test_the_largest_event_id_is_valid(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis
) -> None:
    """Both parts at 2**64-1: Redis accepts it; a finished job's stream simply ends after it."""
    job_id = await new_job(client)
    finish_done(r, gateway.keys, job_id, "Red.")
    top = f"{2**64 - 1}-{2**64 - 1}"
    async with client.stream("GET", f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": top}) as resp:
        assert resp.status_code == 200
        assert "event:" not in (await resp.aread()).decode()


# --- bodies ---
@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"[" * 100_000, "nested too deeply"),
        (b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
        ('{"prompt": "caf\xe9"}'.encode("latin-1"), "UTF-8"),
        (b'{"prompt": "\xc3\x28"}', "UTF-8"),
        (b'"just a string"', "JSON object"),
        (b"null", "JSON object"),
    ],
    ids=["deep-array", "deep-field", "latin-1", "bad-utf-8", "string", "null"],
)
async def test_bad_json_bodies_on_the_jobs_route(
    client: httpx.AsyncClient, gateway: ServiceStack, body: bytes, words: str
) -> None:
    before = stored_keys(gateway)
    resp = await client.post("/v1/jobs", content=body, headers={"content-type": "application/json"})
    error = error_of(resp, 400)
    assert words in error["message"] and error["code"] == "bad_json", error
    assert stored_keys(gateway) == before


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000,
        b'{"model": "x", "messages": ' + b"[" * 100_000 + b"}",
        b'{"model": "caf\xe9"}',
        b"[]",
        b"7",
    ],
    ids=["deep", "deep-messages", "latin-1", "array", "number"],
)
async def test_bad_json_bodies_on_the_openai_route(client: httpx.AsyncClient, body: bytes) -> None:
    resp = await client.post(
        "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    assert resp.status_code in (400, 422), resp.text
    error = resp.json()["error"]
    assert error["message"]
    if resp.status_code == 400:  # the body itself, not a field: the jobs route's code
        assert error["code"] == "bad_json", error


async def test_multipart_fields_that_are_not_utf8_are_read_not_crashed(client: httpx.AsyncClient) -> None:
    files = {"image": ("a.jpg", JPEG, "image/jpeg")}
    resp = await client.post("/v1/jobs", data={"prompt": b"caf\xe9", "max_tokens": b"\xff"}, files=files)
    error = error_of(resp, 422)  # the prompt reads as Latin-1; max_tokens is not a number
    assert error["param"] == "max_tokens"


# --- OpenAI conversation size ---
def conversation(turns: int, chars: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for i in range(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": "x" * chars})
    messages[0] = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": DATA_URL}}]}
    messages[-1] = {"role": "user", "content": "What is it?"}
    return messages


@pytest.mark.parametrize(
    ("turns", "chars", "words"),
    [
        (65, 10, "65 messages exceed the limit of 64"),
        (20, 2000, "characters of text exceed the limit of 32000"),
    ],
    ids=["turns", "characters"],
)
async def test_oversized_conversations_are_refused_before_anything_is_stored(
    client: httpx.AsyncClient, gateway: ServiceStack, turns: int, chars: int, words: str
) -> None:
    before = stored_keys(gateway)
    body = {"model": gateway.settings.model_name, "messages": conversation(turns, chars)}
    error = error_of(await client.post("/v1/chat/completions", json=body), 413)
    assert words in error["message"] and error["code"] == "conversation_too_large", error
    assert stored_keys(gateway) == before


@pytest.fixture(scope="module")
def full_size_gateway(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceStack]:
    """A gateway with the default limits (10 MB images): the issue's payloads at their real size."""
    stack = ServiceStack(redis_url, tmp_path_factory.mktemp("full-size"), components=("gateway",))
    with running(stack, timeout_s=60):
        yield stack


async def test_the_issues_conversation_is_refused_fast(full_size_gateway: ServiceStack) -> None:
    """1,000 messages of 8,000 characters (8 MB, within the default body limit): 413 at once, where
    the inference worker used to tokenize it for ~8 s before refusing it."""
    stack = full_size_gateway
    before = stored_keys(stack)
    body = {"model": stack.settings.model_name, "messages": conversation(1000, 8000)}
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=30) as client:
        started = time.perf_counter()
        resp = await client.post("/v1/chat/completions", json=body)
        elapsed = time.perf_counter() - started
    error = error_of(resp, 413)
    assert "1000 messages" in error["message"]
    print(f"1,000 x 8,000-character conversation refused in {elapsed * 1000:.0f} ms")
    assert elapsed < 2.0
    assert stored_keys(stack) == before


# --- images the gateway refuses from their structure, at full size ---
@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("jpeg_com_flood", "more than 256 markers"),
        ("png_chunk_flood", "more than 256 chunks"),
        ("jpeg_dqt_flood", "quantization tables"),
        ("jpeg_photoshop_flood", "Photoshop"),
        ("png_ztxt_bomb", "compressed text"),
        ("jpeg_without_eoi", "end-of-image marker"),
        ("jpeg_without_scan_data", "no scan data"),
        ("png_without_iend", "IEND"),
        ("truncated_jpeg", "truncated"),
        ("truncated_png", "truncated"),
    ],
)
async def test_costly_or_truncated_images_are_refused_fast(
    full_size_gateway: ServiceStack, name: str, words: str
) -> None:
    """COM floods cost Pillow ~4 s of gateway CPU, PNG chunk floods ~5 s; truncated files passed
    the header check and were answered as if whole. Now: 400 ``bad_image`` from the structure walk."""
    data = bad_images()[name][0]
    before = stored_keys(full_size_gateway)
    async with httpx.AsyncClient(base_url=full_size_gateway.base_url, timeout=30) as client:
        started = time.perf_counter()
        resp = await client.post(
            "/v1/jobs", data={"prompt": "x"}, files={"image": ("a.jpg", data, "image/jpeg")}
        )
        elapsed = time.perf_counter() - started
        error = error_of(resp, 400)
        assert words in error["message"] and error["code"] == "bad_image", error
        url = "data:image/jpeg;base64," + base64.b64encode(data).decode()
        content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "x"}]
        body = {
            "model": full_size_gateway.settings.model_name,
            "messages": [{"role": "user", "content": content}],
        }
        error = error_of(await client.post("/v1/chat/completions", json=body), 400)
        assert words in error["message"], error
    print(f"{name} ({len(data) / 1e6:.1f} MB) refused in {elapsed * 1000:.0f} ms")
    assert elapsed < 1.0
    assert stored_keys(full_size_gateway) == before


async def test_an_mpo_is_accepted_as_a_jpeg(client: httpx.AsyncClient, gateway: ServiceStack) -> None:
    files = {"image": ("phone.jpg", mpo((160, 120), (80, 60)), "image/jpeg")}
    resp = await client.post(
        "/v1/jobs", data={"prompt": "Colour?"}, files=files, headers={"Cache-Control": "no-cache"}
    )
    assert resp.status_code == 202, resp.text


@pytest.mark.parametrize("fmt", ["PNG", "WEBP"])
async def test_animated_images_are_refused(
    client: httpx.AsyncClient, gateway: ServiceStack, fmt: str
) -> None:
    before = stored_keys(gateway)
    files = {"image": ("a.png", animated(fmt), "image/png")}
    error = error_of(await client.post("/v1/jobs", data={"prompt": "x"}, files=files), 415)
    assert "animated" in error["message"]
    assert stored_keys(gateway) == before


# --- chat WebSocket frames ---
async def test_bad_frames_on_the_chat_websocket_get_an_error_event_and_the_connection_stays(
    gateway: ServiceStack,
) -> None:
    before = stored_keys(gateway)
    frames: list[str | bytes] = [
        b"\x00\x01binary",
        json.dumps({"prompt": "x"}).encode(),  # JSON, but in a binary frame
        "[" * 100_000,
        '{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}",
        "[1, 2]",
        "not json",
        json.dumps({"prompt": "Colour?", "image": DATA_URL[:40]}),  # truncated data URL
        json.dumps({"type": "bogus", "prompt": "Colour?"}),  # neither a job nor a cancel
    ]
    async with connect(f"{gateway.ws_url}/v1/chat/ws", max_size=None) as ws:
        for frame in frames:
            await ws.send(frame)
            reply = json.loads(await ws.recv())
            assert reply["type"] == "error" and reply["status"] == 400, (frame[:40], reply)
            assert reply["error"]
        await ws.send(json.dumps({"type": "cancel"}))  # nothing streaming: ignored, still open
        await ws.send(json.dumps({"prompt": "Colour?", "image": 5}))  # text only is fine; this is not
        reply = json.loads(await ws.recv())
        assert reply["type"] == "error" and "image" in reply["error"], reply
    assert stored_keys(gateway) == before


@pytest.mark.parametrize(
    "path", ["/healthz", "/readyz", "/v1/models", "/v1/status", "/metrics", "/", "/v1/jobs/" + "0" * 32]
)
async def test_head_answers_wherever_get_does(client: httpx.AsyncClient, path: str) -> None:
    """Uptime checks and load balancers send HEAD: the GET's status and headers, no body."""
    got, head = await client.get(path), await client.head(path)
    assert head.status_code == got.status_code and head.status_code != 405
    assert head.content == b"" and head.headers["content-type"] == got.headers["content-type"]


async def raw_post(gateway: ServiceStack, path: str, rest: str, answered: bool) -> tuple[bytes, str]:
    """POST ``path`` over a bare socket (headers, then ``rest``), as no HTTP client would send it:
    the status line (b"" where ``answered`` is False: the socket is closed at once) and what the
    gateway logged about it (its audit line)."""
    host, port = gateway.base_url.removeprefix("http://").split(":")
    logged_before = len(gateway.procs["gateway"].log())
    reader, writer = await asyncio.open_connection(host, int(port))
    head = f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
    writer.write((head + rest).encode())
    await writer.drain()
    status_line = await asyncio.wait_for(reader.readline(), 10) if answered else b""
    await asyncio.sleep(0.2)
    writer.close()
    for _ in range(50):  # the gateway's audit line comes after the answer, or after it sees the close
        log = gateway.procs["gateway"].log()[logged_before:]
        if f"route={path} " in log:
            break
        await asyncio.sleep(0.1)
    return status_line, log


async def test_broken_chunked_framing_is_the_clients_fault(gateway: ServiceStack) -> None:
    """A body whose chunked framing breaks never arrives whole: the server answers 400 and the
    gateway logs no 500 with a traceback (it was "Exception in ASGI application")."""
    broken = "Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"
    status_line, log = await raw_post(gateway, "/v1/jobs", broken, answered=True)
    assert b" 400 " in status_line
    assert "route=/v1/jobs status=499" in log
    assert "Exception in ASGI application" not in log and "status=500" not in log


@pytest.mark.parametrize("path", ["/v1/chat/ws", "/v1/jobs/" + "0" * 32 + "/stream"])
async def test_plain_http_to_a_websocket_route_is_told_to_upgrade(
    client: httpx.AsyncClient, path: str
) -> None:
    resp = await client.get(path)
    assert resp.status_code == 426 and resp.headers["upgrade"] == "websocket"
    assert resp.json()["error"]["code"] == "upgrade_required"


async def test_an_unknown_websocket_message_type_is_named(gateway: ServiceStack) -> None:
    async with connect(f"{gateway.ws_url}/v1/chat/ws") as ws:
        await ws.send(json.dumps({"type": "bogus"}))
        reply = json.loads(await ws.recv())
    assert reply["code"] == "unknown_message_type" and reply["param"] == "type" and "bogus" in reply["error"]


async def test_a_client_leaving_mid_body_is_a_499(gateway: ServiceStack) -> None:
    """FastAPI's body reader wraps the disconnect in a 400; the audit log says the client left."""
    partial = 'Content-Length: 5000\r\n\r\n{"model": "x", "mess'
    _, log = await raw_post(gateway, "/v1/chat/completions", partial, answered=False)
    assert "route=/v1/chat/completions status=499" in log, log[-2000:]
