"""API keys, tenants, quotas, priorities and the browser-facing defaults, against a real gateway.

Every route and WebSocket: no key -> 401 (WebSocket: close 1008), a wrong key -> 401, a good key
works, nothing stored for a refused request; tenant B sees none of tenant A's objects (404, not
403); quotas count across two gateway processes; the keys file rotates without a restart.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from scripts.redis_launcher import free_port
from tests.gateway.conftest import GATEWAY_ENV, stored_keys
from tests.support.jobs import image_bytes
from tests.support.stack import ServiceStack, running

PNG = image_bytes("PNG", (64, 64), seed=5)
DATA_URL = "data:image/png;base64," + base64.b64encode(PNG).decode()
KEYS_FILE = """
key-alpha tenant=alpha
key-delta tenant=delta rpm=3  # the quota test's alone
key-beta tenant=beta
key-gamma tenant=gamma priority=batch
key-ops tenant=ops admin
"""
A, B = {"Authorization": "Bearer key-alpha"}, {"Authorization": "Bearer key-beta"}


@pytest.fixture(scope="module")
def keyed(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceStack]:
    folder = tmp_path_factory.mktemp("keyed")
    (folder / "keys").write_text(KEYS_FILE)
    env = {**GATEWAY_ENV, "VLMQ_API_KEYS_FILE": str(folder / "keys"), "VLMQ_METRICS_PORT": str(free_port())}
    stack = ServiceStack(redis_url, folder, extra_env=env, components=("gateway",))
    with running(stack, timeout_s=60):
        yield stack


def submit(client: httpx.Client, headers: dict[str, str], **fields: str) -> httpx.Response:
    files = {"image": ("a.png", PNG, "image/png")}
    return client.post("/v1/jobs", data={"prompt": "Hi", **fields}, files=files, headers=headers)


ROUTES = [
    ("POST", "/v1/jobs"),
    ("GET", "/v1/jobs/" + "0" * 32),
    ("DELETE", "/v1/jobs/" + "0" * 32),
    ("GET", "/v1/jobs/" + "0" * 32 + "/events"),
    ("GET", "/v1/sessions/s-1"),
    ("DELETE", "/v1/sessions/s-1"),
    ("POST", "/v1/chat/completions"),
    ("GET", "/v1/models"),
    ("GET", "/v1/status"),
    ("GET", "/metrics"),
    ("GET", "/v1/dead-letters"),
    ("POST", "/v1/dead-letters/" + "0" * 32 + "/retry"),
]


@pytest.mark.parametrize(("method", "path"), ROUTES)
@pytest.mark.parametrize("key", [None, "not-a-key"])
def test_every_route_needs_a_good_key(keyed: ServiceStack, method: str, path: str, key: str | None) -> None:
    before = stored_keys(keyed)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    resp = httpx.request(method, keyed.base_url + path, headers=headers, json={"prompt": "x"})
    assert resp.status_code == 401, resp.text
    assert resp.json()["error"]["code"] == "invalid_api_key" and resp.headers["www-authenticate"] == "Bearer"
    assert stored_keys(keyed) == before


def test_probes_stay_open_and_a_good_key_works(keyed: ServiceStack) -> None:
    with httpx.Client(base_url=keyed.base_url, timeout=30) as client:
        assert client.get("/healthz").status_code == 200
        assert client.get("/readyz").status_code in (200, 503)  # no worker here: open, not ready
        accepted = submit(client, A)
        assert accepted.status_code == 202, accepted.text
        assert client.get(f"/v1/jobs/{accepted.json()['id']}", headers=A).status_code == 200
        assert client.get("/v1/models", headers=B).status_code == 200


@pytest.mark.parametrize("path", ["/v1/chat/ws", "/v1/jobs/" + "0" * 32 + "/stream"])
async def test_websockets_close_1008_without_a_good_key(keyed: ServiceStack, path: str) -> None:
    for protocols in ([], ["vlmq.v1", "vlmq.bearer.wrong"]):
        async with connect(keyed.ws_url + path, subprotocols=protocols or None) as ws:  # type: ignore[arg-type]
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 10)
                await asyncio.wait_for(ws.recv(), 10)
            assert ws.close_code == 1008


async def test_a_browser_websocket_authenticates_with_its_subprotocol(keyed: ServiceStack) -> None:
    url = keyed.ws_url + "/v1/chat/ws"
    async with connect(url, subprotocols=["vlmq.v1", "vlmq.bearer.key-alpha"]) as ws:  # type: ignore[list-item]
        assert ws.subprotocol == "vlmq.v1"  # never the key echoed back
        await ws.send(json.dumps({"prompt": "Hi", "image": DATA_URL}))
        accepted = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert accepted["type"] == "accepted", accepted


def test_tenants_cannot_see_each_others_objects(keyed: ServiceStack) -> None:
    with httpx.Client(base_url=keyed.base_url, timeout=30) as client:
        job = submit(client, A, session_id="shared-name").json()
        job_id = job["id"]
        for method, path in [
            ("GET", f"/v1/jobs/{job_id}"),
            ("DELETE", f"/v1/jobs/{job_id}"),
            ("GET", f"/v1/jobs/{job_id}/events"),
            ("GET", "/v1/sessions/shared-name"),
            ("DELETE", "/v1/sessions/shared-name"),
        ]:
            resp = client.request(method, path, headers=B)
            assert resp.status_code == 404, (method, path, resp.text)
        assert client.get(f"/v1/jobs/{job_id}", headers=A).json()["status"] == "queued"  # untouched
        assert client.get("/v1/sessions/shared-name", headers=A).status_code == 200
        # B's own "shared-name" is another conversation: A's image and turns stay A's
        follow_up = client.post("/v1/jobs", data={"prompt": "Size?", "session_id": "shared-name"}, headers=B)
        assert follow_up.status_code == 404 and follow_up.json()["error"]["code"] == "session_not_found"
        assert client.get("/v1/sessions/shared-name", headers=A).json()["image_digest"]


async def test_a_tenant_cannot_stream_another_tenants_job(keyed: ServiceStack) -> None:
    job_id = submit(httpx.Client(base_url=keyed.base_url), A).json()["id"]
    async with connect(f"{keyed.ws_url}/v1/jobs/{job_id}/stream", additional_headers=B) as ws:
        error = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert error["error"]["code"] == "job_not_found"


def test_requests_per_minute_hold_across_two_gateways(
    keyed: ServiceStack, stack_factory: Callable[..., Any]
) -> None:
    env = {k: v for k, v in keyed.env.items() if k.startswith("VLMQ_") and k != "VLMQ_METRICS_PORT"}
    second = stack_factory(components=("gateway",), extra_env=env)  # same Redis, same key space
    if time.time() % 60 > 50:  # all four requests in one minute's window
        time.sleep(61 - time.time() % 60)
    delta = {"Authorization": "Bearer key-delta"}
    responses = [
        submit(httpx.Client(base_url=gw.base_url, timeout=30), delta) for gw in (keyed, second, keyed)
    ]
    assert [r.status_code for r in responses] == [202, 202, 202], [r.text for r in responses]
    assert responses[0].headers["x-ratelimit-limit-requests"] == "3"
    assert responses[2].headers["x-ratelimit-remaining-requests"] == "0"
    before = stored_keys(keyed)
    over = submit(httpx.Client(base_url=second.base_url, timeout=30), delta)
    assert over.status_code == 429 and over.json()["error"]["code"] == "rate_limit_exceeded"
    assert int(over.headers["retry-after"]) >= 1 and over.headers["x-ratelimit-remaining-requests"] == "0"
    assert stored_keys(keyed) == before  # the refused one stored nothing


def test_metrics_listener_needs_no_key(keyed: ServiceStack) -> None:
    port = keyed.env["VLMQ_METRICS_PORT"]
    resp = httpx.get(f"http://127.0.0.1:{port}/metrics")
    assert resp.status_code == 200 and "vlmq_gateway_auth_failures_total" in resp.text
    assert httpx.get(f"{keyed.base_url}/metrics").status_code == 401  # the API port's needs one


def test_a_batch_key_cannot_ask_for_interactive(keyed: ServiceStack) -> None:
    client = httpx.Client(base_url=keyed.base_url, timeout=30)
    gamma = {"Authorization": "Bearer key-gamma"}
    assert submit(client, gamma, priority="interactive").status_code == 403
    job = submit(client, gamma)
    assert job.status_code == 202
    assert keyed.redis.llen(keyed.keys.decode_queue("decode.batch")) >= 1  # its own queue


def test_operator_routes_need_an_admin_key(keyed: ServiceStack) -> None:
    client = httpx.Client(base_url=keyed.base_url, timeout=30)
    assert client.get("/v1/dead-letters", headers=B).status_code == 403
    assert client.get("/v1/dead-letters", headers={"Authorization": "Bearer key-ops"}).status_code == 200


def test_keys_rotate_without_a_restart(keyed: ServiceStack) -> None:
    keys_file = Path(keyed.env["VLMQ_API_KEYS_FILE"])
    client = httpx.Client(base_url=keyed.base_url, timeout=30)
    keys_file.write_text(KEYS_FILE.replace("key-beta", "key-beta-2"))
    try:
        deadline = time.monotonic() + 10
        while client.get("/v1/models", headers={"Authorization": "Bearer key-beta-2"}).status_code != 200:
            assert time.monotonic() < deadline, "the new key never worked"
            time.sleep(0.2)
        assert client.get("/v1/models", headers=B).status_code == 401  # the old one is gone
    finally:
        keys_file.write_text(KEYS_FILE)
        time.sleep(1.5)


def test_browser_defaults_origin_host_and_headers(keyed: ServiceStack) -> None:
    client = httpx.Client(base_url=keyed.base_url, timeout=30)
    foreign = client.post("/v1/jobs", headers={**A, "Origin": "https://evil.example"}, data={"prompt": "x"})
    assert foreign.status_code == 403
    same = submit(client, {**A, "Origin": keyed.base_url})
    assert same.status_code == 202
    assert client.get("/healthz", headers={"Host": "attacker.example"}).status_code == 200  # probes exempt
    bad_host = client.get("/v1/models", headers={**A, "Host": "attacker.example"})
    assert bad_host.status_code == 400
    page = client.get("/")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-frame-options"] == "DENY" and page.headers["x-content-type-options"] == "nosniff"
    assert client.get("/docs").status_code == 200  # development: served; production: off


async def test_a_foreign_origin_cannot_open_a_websocket(keyed: ServiceStack) -> None:
    with pytest.raises(InvalidStatus):
        async with connect(keyed.ws_url + "/v1/chat/ws", origin="https://evil.example"):  # type: ignore[arg-type]
            pass


def test_audit_log_names_tenant_route_status_and_job_never_the_key(keyed: ServiceStack) -> None:
    job_id = submit(httpx.Client(base_url=keyed.base_url), A).json()["id"]
    time.sleep(0.2)
    log = keyed.procs["gateway"].log()
    assert f"client=127.0.0.1 tenant=alpha method=POST route=/v1/jobs status=202 job={job_id}" in log
    assert "key-alpha" not in log and "key-beta" not in log
