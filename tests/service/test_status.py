"""``GET /v1/status`` on the real stack: what the web page's status view and ``vlmq status`` show."""

from __future__ import annotations

import httpx

from tests.service.conftest import wait_done
from tests.support.jobs import image_bytes
from tests.support.stack import ServiceStack


async def test_status_shows_the_worker_caches_and_recent_latency(
    client: httpx.AsyncClient, service_stack: ServiceStack
) -> None:
    data = image_bytes("PNG", (200, 200), seed=31)
    files = {"image": ("i.png", data, "image/png")}
    job = (await client.post("/v1/jobs", data={"prompt": "How many shapes are there?"}, files=files)).json()
    view = await wait_done(client, job["id"])
    status = (await client.get("/v1/status")).json()
    assert status["model"] == service_stack.settings.model_name
    assert [w["id"] for w in status["workers"]] == [f"inference-{service_stack.key_prefix}"]
    assert status["workers"][0]["healthy"] and status["workers"][0]["capacity"] > 0
    assert status["workers"][0]["device"] == "cpu"  # the device in use, never the setting "auto"
    assert {"prefix", "session", "image"} <= set(status["caches"])
    assert set(status["queues"]["decode"]) == {"decode", "decode.batch"}
    recent = status["recent"]
    assert recent["jobs"] >= 1 and recent["ttft_s"]["p95"] >= recent["ttft_s"]["p50"] > 0
    assert recent["total_s"]["p50"] > 0 and view["timings"]["total"] > 0
    assert status["flower_url"] is None  # VLMQ_FLOWER_URL unset: the page shows no link
