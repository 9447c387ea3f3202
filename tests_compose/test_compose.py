"""docker-compose.yml for real: every client route through the published port answers what the
in-process engine answers, decode scales to three workers that all take tasks, and a SIGKILLed
inference worker is brought back by the restart policy and finishes the jobs it held.

Tests run in file order on one stack (``stack``: build, ``up --wait``, ``down -v``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from websockets.asyncio.client import connect

from shared.jobs import JobRecord
from shared.keys import INFERENCE_GROUP
from shared.schemas import JobSpec, JobStatus
from tests.gateway.clients import read_sse, token_text
from tests.service.conftest import wait_done
from tests.support.jobs import image_bytes
from tests.support.models import test_model_path as served_model_path
from tests.support.reference import Reference
from tests_compose.conftest import ComposeStack, note, timed

pytestmark = pytest.mark.timeout(600)  # the first test also builds the image and starts the stack

NO_CACHE = {"Cache-Control": "no-cache"}
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "shapes.png"
PROMPTS = ["What colour is the square?", "How many shapes are there?", "Where is the circle?"]


@pytest.fixture(scope="session")
def reference() -> Iterator[Reference]:
    ref = Reference(str(served_model_path()))  # models/vlmq-tiny: the checkpoint inside the image
    yield ref
    ref.close()


@pytest.fixture
async def client(stack: ComposeStack) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=60, headers=stack.auth_headers) as c:
        yield c


def spec_of(stack: ComposeStack, job_id: str) -> JobSpec:
    return JobRecord.from_hash(stack.redis.hgetall(stack.keys.job(job_id))).spec


async def submit(client: httpx.AsyncClient, data: bytes, prompt: str, name: str = "i.jpg") -> str:
    resp = await client.post(
        "/v1/jobs",
        data={"prompt": prompt, "max_tokens": "16"},
        files={"image": (name, data, "image/png" if name.endswith(".png") else "image/jpeg")},
        headers=NO_CACHE,
    )
    assert resp.status_code == 202, resp.text
    return str(resp.json()["id"])


# --- secrets: generated once on a clean clone, required everywhere ---


async def test_generated_secrets_are_required_and_kept(stack: ComposeStack) -> None:
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=30) as anonymous:
        assert (await anonymous.get("/v1/models")).status_code == 401
        wrong = {"Authorization": "Bearer wrong"}
        assert (await anonymous.get("/v1/models", headers=wrong)).status_code == 401
        assert (await anonymous.get("/v1/models", headers=stack.auth_headers)).status_code == 200
        assert (await anonymous.get("/docs")).status_code == 404  # production: no API docs
        assert (await anonymous.get("/healthz")).status_code == 200  # probes stay open
    again = stack.compose("run", "--rm", "--no-deps", "secrets", timeout=120)
    assert "all present" in again and stack.api_key not in again  # printed once, then kept
    assert stack.redis.ping()


# --- every client route, answers equal to the engine's ---


async def test_multipart_job_and_polling(
    stack: ComposeStack, client: httpx.AsyncClient, reference: Reference
) -> None:
    data = EXAMPLE.read_bytes()  # the README's curl example
    job_id = await submit(client, data, "What colour is the circle?", name="shapes.png")
    view = await wait_done(client, job_id)
    assert view["status"] == "done", view
    assert view["final_text"] == reference.answer(spec_of(stack, job_id), data)


async def test_batch_jobs_are_decoded_by_the_low_weight_service(
    stack: ComposeStack, client: httpx.AsyncClient
) -> None:
    data = EXAMPLE.read_bytes()
    form = {"prompt": "What colour is the circle?", "max_tokens": "4", "priority": "batch"}
    resp = await client.post(
        "/v1/jobs", data=form, files={"image": ("s.png", data, "image/png")}, headers=NO_CACHE
    )
    assert resp.status_code == 202, resp.text
    job_id = str(resp.json()["id"])
    assert (await wait_done(client, job_id))["status"] == "done"
    logs = stack.compose("logs", "--no-color", "decode-batch", timeout=60)
    assert job_id in logs and job_id not in stack.compose("logs", "--no-color", "decode", timeout=60)
    (batch_node,) = stack.containers("decode-batch")
    assert stack.inspect(batch_node, "{{.HostConfig.CpuShares}}") == "110"


async def test_sse(stack: ComposeStack, client: httpx.AsyncClient, reference: Reference) -> None:
    data = image_bytes("PNG", (256, 256), seed=41)
    job_id = await submit(client, data, "Describe the picture.", name="i.png")
    events = [e["data"] for e in await read_sse(client, f"/v1/jobs/{job_id}/events")]
    assert events[-1]["type"] == "done", events[-1]
    assert token_text(events) == events[-1]["final_text"] == reference.answer(spec_of(stack, job_id), data)


async def test_chat_websocket(stack: ComposeStack, reference: Reference) -> None:
    data = image_bytes("JPEG", (300, 200), seed=42)
    message = {
        "prompt": PROMPTS[0],
        "image": "data:image/jpeg;base64," + base64.b64encode(data).decode(),
        "max_tokens": 16,
        "no_cache": True,
    }
    async with connect(f"{stack.ws_url}/v1/chat/ws", additional_headers=stack.auth_headers) as ws:
        await ws.send(json.dumps(message))
        accepted = json.loads(await ws.recv())
        assert accepted["type"] == "accepted", accepted
        events = [json.loads(await asyncio.wait_for(ws.recv(), 60))]
        while events[-1]["type"] not in ("done", "error") and events[-1].get("status") != "failed":
            events.append(json.loads(await asyncio.wait_for(ws.recv(), 60)))
    assert events[-1]["type"] == "done", events[-1]
    expected = reference.answer(spec_of(stack, accepted["id"]), data)
    assert token_text(events) == events[-1]["final_text"] == expected


async def test_openai_route(stack: ComposeStack, reference: Reference) -> None:
    data = image_bytes("JPEG", (320, 240), seed=43)
    url = "data:image/jpeg;base64," + base64.b64encode(data).decode()
    messages: Any = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": PROMPTS[1]},
            ],
        }
    ]
    async with openai.AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key=stack.api_key) as oai:
        full = await oai.chat.completions.create(
            model="vlmq-tiny", messages=messages, max_tokens=16, temperature=0, extra_headers=NO_CACHE
        )
        stream: Any = await oai.chat.completions.create(
            model="vlmq-tiny", messages=messages, max_tokens=16, stream=True, extra_headers=NO_CACHE
        )
        streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    expected = reference.answer(spec_of(stack, full.id.removeprefix("chatcmpl-")), data)
    assert full.choices[0].message.content == streamed == expected


# --- scaling the decode workers ---


def flower_totals(stack: ComposeStack, auth: tuple[str, str] | None) -> dict[str, int]:
    """Decode tasks each Celery node has run since it started, as Flower sees them."""
    resp = httpx.get(f"{stack.flower_url}/api/workers", params={"refresh": "1"}, auth=auth, timeout=30)
    resp.raise_for_status()
    return {name: int(sum(w.get("stats", {}).get("total", {}).values())) for name, w in resp.json().items()}


async def test_decode_scales_to_three(stack: ComposeStack, client: httpx.AsyncClient) -> None:
    timed(
        "scale decode to 3 (up --wait)",
        stack,
        "up",
        "-d",
        "--wait",
        "--no-build",
        "--scale",
        "decode=3",
        timeout=240,
    )
    nodes = {f"decode@{stack.inspect(c, '{{.Config.Hostname}}')}" for c in stack.containers("decode")}
    assert len(nodes) == 3, nodes
    assert httpx.get(f"{stack.flower_url}/api/workers", timeout=10).status_code == 401  # credentials
    before = flower_totals(stack, stack.flower_auth)
    for burst in range(5):  # the broker hands tasks to whoever asks first: repeat until all took some
        images = [image_bytes("JPEG", (160 + 8 * i, 120), seed=100 * burst + i) for i in range(12)]
        ids = await asyncio.gather(*(submit(client, img, PROMPTS[i % 3]) for i, img in enumerate(images)))
        views = await asyncio.gather(*(wait_done(client, job_id, timeout_s=120) for job_id in ids))
        assert [v["status"] for v in views] == ["done"] * len(ids)
        after = flower_totals(stack, stack.flower_auth)
        if all(after.get(n, 0) > before.get(n, 0) for n in nodes):
            note(
                "decode tasks per node",
                ", ".join(f"{n}: {after[n] - before.get(n, 0)}" for n in sorted(nodes)),
            )
            return
    pytest.fail(f"not every decode node took a task: before {before}, after {after}")


# --- SIGKILL of the inference worker ---


def held_count(stack: ComposeStack, consumer: str) -> int:
    """How many stream entries ``consumer`` holds unacknowledged (one round trip: XPENDING summary)."""
    summary = stack.redis.xpending(stack.keys.inference_stream(), INFERENCE_GROUP)
    return sum(int(c["pending"]) for c in summary["consumers"] or [] if c["name"].decode() == consumer)


def held_jobs(stack: ComposeStack, consumer: str) -> list[str]:
    """Jobs delivered to ``consumer`` and not yet acknowledged (its stream entries still pending)."""
    r = stack.redis
    stream = stack.keys.inference_stream()
    pending = r.xpending_range(stream, INFERENCE_GROUP, "-", "+", 100, consumername=consumer)
    entries = [r.xrange(stream, p["message_id"], p["message_id"]) for p in pending]
    return [fields[b"job_id"].decode() for found in entries for _id, fields in found]


def begun_and_open(stack: ComposeStack, jobs: list[str]) -> bool:
    """Whether one of ``jobs`` has begun an attempt and is not yet finished: a worker that read its
    entries but has not begun them yet would run them again as their first attempt."""
    pipe = stack.redis.pipeline()
    for job_id in jobs:
        pipe.hmget(stack.keys.job(job_id), "attempt", "status")
    rows = pipe.execute()
    return any(int(attempt or 0) >= 1 and not JobStatus(status.decode()).terminal for attempt, status in rows)


def sigkill(pid: int) -> None:
    """`kill -9` from the host (not `docker kill`: a manual stop, which is never restarted)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except PermissionError:  # a non-root developer: the same kill from a root helper in the host PID space
        cmd = ["docker", "run", "--rm", "--pid", "host", "--user", "0", "--pull", "never"]
        subprocess.run([*cmd, "vlmq/vlmq:0.1.0", "sh", "-c", f"kill -9 {pid}"], check=True, timeout=60)


def kill_when_busy(
    stack: ComposeStack, container: str, consumer: str, timeout_s: float = 60
) -> tuple[list[str], float]:
    """SIGKILL the worker once it holds a few jobs; returns the jobs it held when it died, and when."""
    pid = int(stack.inspect(container, "{{.State.Pid}}"))
    deadline = time.monotonic() + timeout_s
    while held_count(stack, consumer) < 4 or not begun_and_open(stack, held_jobs(stack, consumer)):
        assert time.monotonic() < deadline, "the inference worker never held 4 jobs, one of them begun"
        time.sleep(0.005)
    sigkill(pid)
    killed_at = time.monotonic()
    return held_jobs(stack, consumer), killed_at  # read before the restarted worker (same name) reads them


def wait_healthy(stack: ComposeStack, container: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while stack.inspect(container, "{{.State.Health.Status}}") != "healthy":
        assert time.monotonic() < deadline, f"{container} not healthy after {timeout_s}s"
        time.sleep(1)


async def test_inference_sigkill_mid_job(
    stack: ComposeStack, client: httpx.AsyncClient, reference: Reference
) -> None:
    container = stack.containers("inference")[0]
    consumer = stack.inspect(container, "{{.Config.Hostname}}")  # its worker id (docker-compose.yml)
    restarts = int(stack.inspect(container, "{{.RestartCount}}"))
    images = [image_bytes("JPEG", (200 + 4 * i, 160), seed=500 + i) for i in range(32)]
    killer = asyncio.create_task(asyncio.to_thread(kill_when_busy, stack, container, consumer))
    ids = await asyncio.gather(*(submit(client, img, PROMPTS[i % 3]) for i, img in enumerate(images)))
    held, killed_at = await killer
    assert held, "the worker held no job when it died"
    done = await asyncio.gather(*(wait_done(client, i, timeout_s=180) for i in ids))
    recovered_s = time.monotonic() - killed_at
    views = dict(zip(ids, done, strict=True))
    assert [v for v in done if v["status"] != "done"] == []
    assert int(stack.inspect(container, "{{.RestartCount}}")) == restarts + 1
    assert any(views[j]["attempt"] >= 2 for j in held), "no held job was run again after the restart"
    for job_id in held:  # a retried job never mixes two attempts: the engine's answer, exactly
        data = images[ids.index(job_id)]
        assert views[job_id]["final_text"] == reference.answer(spec_of(stack, job_id), data), job_id
    wait_healthy(stack, container)
    assert (await client.get("/readyz")).status_code == 200
    rerun = sum(views[j]["attempt"] >= 2 for j in held)
    note(
        "inference SIGKILL",
        f"{len(held)} jobs held by the killed worker ({rerun} run again after the restart); "
        f"{len(ids)}/{len(ids)} done {recovered_s:.1f} s after the kill",
    )
