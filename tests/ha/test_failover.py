"""The whole stack (gateway, Celery decode worker, inference worker) on a ``sentinel://`` URL with
``VLMQ_REDIS_MIN_REPLICAS=1``, submitting a job every ``INTERVAL_S`` while Redis fails over.

1. ``SENTINEL FAILOVER`` (planned): every job answered 202 before, during and after ends ``done``
   with the answer of a run without failover (the reference engine).
2. SIGKILL of the master: every job answered 202 reaches ``done`` once the replica is promoted.

Submissions that get 503 (no replica acknowledged, or no master yet) were not accepted; a client
retries them. The test sweeper runs every few seconds (``VLMQ_STUCK_AFTER_S``) so that work a
failover rolled back (a handoff acknowledged by the old master only) is redone within the test.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from shared.jobs import JobRecord
from tests.support.jobs import image_bytes
from tests.support.reference import Reference
from tests.support.sentinel import MASTER_NAME, SentinelCluster
from tests.support.stack import ServiceStack, running

INTERVAL_S = 0.25
BURST = 6
IMAGES = [image_bytes("JPEG", (320, 240), seed=s) for s in range(3)]
PROMPTS = ["What colour is the square?", "Describe the picture.", "How many shapes are there?"]
STACK_ENV = {
    "VLMQ_REDIS_SENTINEL_MASTER": MASTER_NAME,
    "VLMQ_REDIS_MIN_REPLICAS": "1",
    "VLMQ_REDIS_WAIT_MS": "300",
    "VLMQ_STUCK_AFTER_S": "6",
}
NO_CACHE = {"Cache-Control": "no-cache"}  # every job runs the whole pipeline


@dataclass
class Load:
    """Jobs submitted by ``run``: accepted ones by phase, refusals, until ``stop`` is set."""

    base_url: str
    accepted: list[tuple[str, int, str]] = field(default_factory=list)  # job id, input index, phase
    refused: dict[str, int] = field(default_factory=dict)
    refused_at: list[float] = field(default_factory=list)
    phase: str = "before"
    stop: threading.Event = field(default_factory=threading.Event)
    submitted: int = 0

    async def run(self) -> None:
        async with httpx.AsyncClient(base_url=self.base_url, timeout=30) as client:
            while not self.stop.is_set():
                await self.submit(client)
                await asyncio.sleep(INTERVAL_S)

    async def burst(self, count: int) -> None:
        """``count`` submissions at once: jobs queued, decoding and generating when the fault hits."""
        async with httpx.AsyncClient(base_url=self.base_url, timeout=30) as client:
            await asyncio.gather(*(self.submit(client) for _ in range(count)))

    async def submit(self, client: httpx.AsyncClient) -> None:
        n, self.submitted = self.submitted, self.submitted + 1
        form = {"prompt": PROMPTS[n % len(PROMPTS)], "max_tokens": "12"}
        files = {"image": ("i.jpg", IMAGES[n % len(IMAGES)], "image/jpeg")}
        phase = self.phase
        resp = await client.post("/v1/jobs", data=form, files=files, headers=NO_CACHE)
        if resp.status_code == 202:
            self.accepted.append((resp.json()["id"], n, phase))
        else:
            key = f"{phase} {resp.status_code} {resp.json()['error']['code']}"
            self.refused[key] = self.refused.get(key, 0) + 1
            self.refused_at.append(time.monotonic())

    def accepted_in(self, phase: str) -> int:
        return sum(p == phase for _, _, p in self.accepted)


@pytest.fixture(scope="module")
def reference() -> Iterator[Reference]:
    from tests.support.models import test_model_path

    ref = Reference(str(test_model_path()))
    yield ref
    ref.close()


@pytest.fixture
def ha_stack(cluster: SentinelCluster, tmp_path: Path, request: pytest.FixtureRequest) -> ServiceStack:
    """The stack on the cluster's sentinels (not started); its logs go with a failing report."""
    stack = ServiceStack(cluster.url, tmp_path, extra_env=STACK_ENV)
    request.node._vlmq_stacks = [stack]
    return stack


async def with_load(stack: ServiceStack, fault: Callable[[Load], None]) -> tuple[Load, int]:
    """Submit jobs before, during and after ``fault`` (run in a thread; it sets the phases).
    Returns the load and how many accepted jobs were not finished yet when the fault began."""
    load = Load(stack.base_url)
    submitter = asyncio.create_task(load.run())
    try:
        while load.accepted_in("before") < 4 and not submitter.done():  # warm and answering
            await asyncio.sleep(0.1)
        await load.burst(BURST)
        in_flight = int(stack.redis.zcard(stack.keys.active_jobs()))
        await asyncio.to_thread(fault, load)
    finally:
        load.stop.set()
        await submitter
    return load, in_flight


async def finish_all(
    stack: ServiceStack, load: Load, timeout_s: float = 90.0
) -> dict[str, dict[str, object]]:
    """Every accepted job's final view (polled until terminal)."""
    views: dict[str, dict[str, object]] = {}
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=30) as client:
        for job_id, _, _ in load.accepted:
            while True:
                resp = await client.get(f"/v1/jobs/{job_id}")
                if resp.status_code == 200 and resp.json()["status"] in (
                    "done",
                    "failed",
                    "cancelled",
                    "expired",
                ):
                    views[job_id] = resp.json()
                    break
                assert time.monotonic() < deadline, (
                    f"job {job_id} not finished: {resp.status_code} {resp.text}"
                )
                await asyncio.sleep(0.2)
    return views


def expected_answers(stack: ServiceStack, load: Load, reference: Reference) -> dict[str, str]:
    answers: dict[int, str] = {}
    out = {}
    for job_id, n, _ in load.accepted:
        key = n % (len(IMAGES) * len(PROMPTS))
        if key not in answers:
            spec = JobRecord.from_hash(stack.redis.hgetall(stack.keys.job(job_id))).spec
            answers[key] = reference.answer(spec, IMAGES[n % len(IMAGES)])
        out[job_id] = answers[key]
    return out


def report(
    name: str, load: Load, in_flight: int, seconds: float, views: dict[str, dict[str, object]]
) -> None:
    phases = {p: load.accepted_in(p) for p in ("before", "during", "after")}
    statuses = {str(v["status"]) for v in views.values()}
    refusing = max(load.refused_at) - min(load.refused_at) if load.refused_at else 0.0
    print(
        f"\n[{name}] failover {seconds:.1f}s; {in_flight} jobs in flight at the fault; accepted {phases}; "
        f"refused {load.refused} over {refusing:.1f}s; final statuses {statuses}"
    )


async def test_sentinel_failover_with_jobs_in_flight_loses_nothing(
    cluster: SentinelCluster, ha_stack: ServiceStack, reference: Reference
) -> None:
    timing: dict[str, float] = {}

    def failover(load: Load) -> None:
        load.phase = "during"
        timing["failover"] = cluster.failover()  # until a replica answers as the new master
        cluster.wait_replicas_in_sync(1, timeout_s=60)  # the old master rejoins as its replica
        load.phase = "after"
        deadline = time.monotonic() + 30
        while load.accepted_in("after") < 4 and time.monotonic() < deadline:
            time.sleep(0.1)

    with running(ha_stack) as stack:
        load, in_flight = await with_load(stack, failover)
        views = await finish_all(stack, load)
        report("SENTINEL FAILOVER", load, in_flight, timing["failover"], views)
        expected = expected_answers(stack, load, reference)
    assert load.accepted_in("before") >= 4 + BURST and load.accepted_in("after") >= 4 and in_flight > 0
    assert {job_id: views[job_id]["status"] for job_id in views} == dict.fromkeys(views, "done")
    assert {job_id: views[job_id]["text"] for job_id in views} == expected


async def test_sigkill_of_the_master_loses_nothing_accepted(
    cluster: SentinelCluster, ha_stack: ServiceStack, reference: Reference
) -> None:
    timing: dict[str, float] = {}

    def crash(load: Load) -> None:
        old = cluster.master()
        load.phase = "during"
        started = time.monotonic()
        old.kill()
        cluster.wait_new_master(old.port, timeout_s=30)
        timing["failover"] = time.monotonic() - started
        load.phase = "after"
        time.sleep(2.0)  # no replica is left: every submission now is refused (503)

    with running(ha_stack) as stack:
        load, in_flight = await with_load(stack, crash)
        views = await finish_all(stack, load)
        report("SIGKILL master", load, in_flight, timing["failover"], views)
        expected = expected_answers(stack, load, reference)
    assert load.accepted_in("before") >= 4 + BURST and load.accepted_in("after") == 0 and in_flight > 0
    assert {job_id: views[job_id]["status"] for job_id in views} == dict.fromkeys(views, "done")
    assert {job_id: views[job_id]["text"] for job_id in views} == expected
