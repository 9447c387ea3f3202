"""Flower lists a job's inference stage beside its decode task: the inference worker's Celery
task events (``VLMQ_TASK_EVENTS``), read through Flower's own API, behind basic auth as
``make up`` runs it (``scripts.commands.flower_command``)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from scripts.commands import flower_command
from scripts.redis_launcher import free_port
from tests.service.conftest import wait_done
from tests.support.jobs import image_bytes
from tests.support.processes import ManagedProcess
from tests.support.stack import ServiceStack

AUTH = ("vlmq", secrets.token_hex(8))


class Flower:
    def __init__(self, url: str) -> None:
        self.url = url
        self.client = httpx.Client(base_url=url, auth=AUTH, timeout=10)

    def up(self) -> bool:
        try:
            return self.client.get("/api/tasks").status_code == 200
        except httpx.HTTPError:
            return False

    def tasks(self) -> dict[str, dict[str, Any]]:
        tasks: dict[str, dict[str, Any]] = self.client.get("/api/tasks").json()
        return tasks

    def workers(self) -> dict[str, dict[str, Any]]:
        listed = self.client.get("/workers", params={"json": 1}).json()["data"]
        return {worker["hostname"]: worker for worker in listed}

    def wait_for(
        self, job_id: str, state: str, timeout_s: float = 30, decode_state: str | None = None
    ) -> dict[str, dict[str, Any]]:
        """The job's decode and inference tasks once its inference task is in ``state`` (and its
        decode task in ``decode_state``, where given)."""
        deadline = time.monotonic() + timeout_s
        wanted = {"vlmq.inference": state, **({"vlmq.decode": decode_state} if decode_state else {})}
        while time.monotonic() < deadline:
            mine = {uuid: t for uuid, t in self.tasks().items() if job_id in str(t.get("args"))}
            states = {t["name"]: t["state"] for t in mine.values()}
            if all(states.get(name) == want for name, want in wanted.items()):
                return mine
            time.sleep(0.2)
        raise TimeoutError(f"no inference task of {job_id} in {state}: {mine}")


@pytest.fixture
def flower_stack(stack_factory: Any, tmp_path: Path) -> Iterator[tuple[ServiceStack, Flower]]:
    stack: ServiceStack = stack_factory(extra_env={"VLMQ_TASK_EVENTS": "true"})
    port = free_port()
    flower = Flower(f"http://127.0.0.1:{port}")
    proc = ManagedProcess(
        "flower",
        flower_command(port, *AUTH),
        stack.env,
        tmp_path / "flower.log",
        ready=lambda _p: flower.up(),
    )
    proc.start()
    try:
        proc.wait_ready(60)
        yield stack, flower
    finally:
        proc.stop()


async def test_flower_lists_inference_beside_decode(flower_stack: tuple[ServiceStack, Flower]) -> None:
    stack, flower = flower_stack
    assert httpx.get(f"{flower.url}/api/tasks").status_code == 401  # never open
    stack.no_decode_task_waiting()  # else a task waiting for jobs takes this one: no task of its own
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=60) as client:
        resp = await client.post(
            "/v1/jobs",
            data={"prompt": "What colour is the square?", "max_tokens": "8"},
            files={"image": ("i.png", image_bytes("PNG", (160, 160), seed=51), "image/png")},
            headers={"Cache-Control": "no-cache"},
        )
        job_id = resp.json()["id"]
        assert (await wait_done(client, job_id))["status"] == "done"
    tasks = flower.wait_for(job_id, "SUCCESS", decode_state="SUCCESS")  # the decode task waits a while
    by_name = {t["name"]: (uuid, t) for uuid, t in tasks.items()}
    assert set(by_name) == {"vlmq.decode", "vlmq.inference"}
    uuid, inference = by_name["vlmq.inference"]
    worker_id = stack.procs["inference"].env["VLMQ_WORKER_ID"]
    assert uuid == f"inference-{job_id}-1" and inference["worker"] == f"inference@{worker_id}"
    assert inference["runtime"] > 0 and inference["result"].endswith(("stop", "length"))
    assert by_name["vlmq.decode"][1]["state"] == "SUCCESS"
    node = flower.workers()[f"inference@{worker_id}"]
    assert node["status"] is True and node["task-succeeded"] >= 1


async def test_a_cancelled_inference_is_revoked(flower_stack: tuple[ServiceStack, Flower]) -> None:
    stack, flower = flower_stack
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=60) as client:
        resp = await client.post(
            "/v1/jobs",
            data={"prompt": "Describe the picture.", "max_tokens": "512", "ignore_eos": "true"},
            files={"image": ("i.png", image_bytes("PNG", (160, 160), seed=52), "image/png")},
            headers={"Cache-Control": "no-cache"},
        )
        job_id = resp.json()["id"]
        flower.wait_for(job_id, "STARTED")
        assert (await client.delete(f"/v1/jobs/{job_id}")).status_code in (200, 202)
        assert (await wait_done(client, job_id))["status"] == "cancelled"
    flower.wait_for(job_id, "REVOKED")
