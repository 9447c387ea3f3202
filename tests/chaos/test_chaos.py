"""Chaos (`make test-chaos`): `make up` on an append-only Redis, 100 jobs while the decode child,
the decode main process and the inference worker are each SIGKILLed twice and Redis restarts
once; every restart of a vlmq process is done by `make up`'s own supervisor.

Pass: every accepted job ends in exactly one terminal state, ``done``; nothing stuck (the
active-jobs set empties) or lost (no 404); each job's streamed tokens are its final text with
no index twice or missing, however often its client dropped and resumed; every answer equals
the engine's batch-of-one greedy answer for the same request (a run without chaos).

Non-default settings (short timings so faults heal within the test): see ``CHAOS_ENV``.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from shared.keys import Keys
from tests.chaos.load import Job, Load
from tests.chaos.up_process import PersistentRedis, UpProcess
from tests.support import jobs as J
from tests.support import models
from tests.support.reference import Reference

pytestmark = pytest.mark.chaos
CHAOS_ENV = {
    "VLMQ_KEY_PREFIX": "vlmqchaos",
    "VLMQ_MODEL": str(models.test_model_path()),
    "VLMQ_STUCK_AFTER_S": "8",  # default 30
    "VLMQ_CLAIM_IDLE_MS": "4000",  # default 30000
    "VLMQ_HEARTBEAT_S": "0.5",  # default 2
    "VLMQ_WORKER_STALE_S": "3",  # default 10
    "VLMQ_DRAIN_TIMEOUT_S": "3",  # default 20 (kept below the claim idle time)
    "VLMQ_VISIBILITY_TIMEOUT_S": "60",  # default 300
    "VLMQ_MAX_DELIVERIES": "6",  # default 3: two kills of the inference worker may hit one job twice
    "VLMQ_MAX_DECODE_ATTEMPTS": "6",  # default 3, for the same reason on the decode side
    "VLMQ_DECODE_CONCURRENCY": "2",
}
SINGLE_JOBS, SESSIONS = 80, 10  # 80 + 10 x 2 turns = 100 jobs
CONCURRENCY = 6
FAULTS = [  # (seconds after the load starts, what)
    (3, "decode-child"),
    (9, "inference"),
    (15, "decode"),
    (21, "redis"),
    (28, "decode-child"),
    (35, "inference"),
    (42, "decode"),
]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[UpProcess, PersistentRedis]]:
    redis_server = PersistentRedis(tmp_path / "redis")
    (tmp_path / "run").mkdir()
    up = UpProcess(redis_server.url, tmp_path / "run", CHAOS_ENV)
    try:
        up.wait_ready()
        yield up, redis_server
    finally:
        up.stop()
        print(up.output()[-6000:])
        redis_server.stop()


def images(rng: random.Random) -> Iterator[tuple[bytes, str]]:
    for i in range(10_000):
        fmt = rng.choice(["JPEG", "PNG"])
        side = rng.choice([96, 168, 320, 640, 1024])
        yield J.image_bytes(fmt, (side, side * 3 // 4), seed=i), fmt


async def run_load(load: Load, rng: random.Random) -> None:
    pictures = images(rng)
    work: asyncio.Queue[tuple[str, bytes, str]] = asyncio.Queue()
    for i in range(SINGLE_JOBS + SESSIONS):
        image, fmt = next(pictures)
        work.put_nowait(("session" if i % 9 == 0 and i // 9 < SESSIONS else "single", image, fmt))

    async def client() -> None:
        while not work.empty():
            kind, image, fmt = work.get_nowait()
            first = await load.submit(image, fmt, "What colour is the circle?", None)
            await load.follow(first)
            if kind == "session":
                second = await load.submit(image, fmt, "And its size?", first.session_id)
                await load.follow(second)

    await asyncio.gather(*[client() for _ in range(CONCURRENCY)])


async def inject_faults(up: UpProcess, redis_server: PersistentRedis, log: list[str]) -> None:
    started = time.monotonic()
    for at, what in FAULTS:
        await asyncio.sleep(max(0.0, started + at - time.monotonic()))
        if what == "redis":
            await asyncio.to_thread(redis_server.restart)
            log.append(f"{time.monotonic() - started:.1f}s redis restarted")
        else:
            pid = await asyncio.to_thread(up.kill, what)
            log.append(f"{time.monotonic() - started:.1f}s SIGKILL {what} (pid {pid})")


async def test_nothing_accepted_is_lost_stuck_or_mixed_under_chaos(
    stack: tuple[UpProcess, PersistentRedis],
) -> None:
    up, redis_server = stack
    rng = random.Random(20261203)
    faults: list[str] = []
    headers = {"Authorization": f"Bearer {up.api_key}"}
    async with httpx.AsyncClient(base_url=up.base_url, timeout=30, headers=headers) as client:
        load = Load(client, rng)
        await asyncio.gather(run_load(load, rng), inject_faults(up, redis_server, faults))
        print("\n".join(faults), f"\naccepted {len(load.accepted)}, refused attempts {load.refusals}")
        assert len(faults) == len(FAULTS)
        assert len(load.accepted) == SINGLE_JOBS + 2 * SESSIONS
        views = [(await client.get(f"/v1/jobs/{job.job_id}")).json() for job in load.accepted]
        metrics = (await client.get("/metrics")).text
    not_done = [v for v in views if v.get("status") != "done"]
    assert not not_done, not_done
    for job, view in zip(load.accepted, views, strict=True):
        check_stream(job, view["final_text"])
    r, keys = redis.Redis.from_url(redis_server.url), Keys(CHAOS_ENV["VLMQ_KEY_PREFIX"])
    assert r.zcard(keys.active_jobs()) == 0  # nothing stuck
    for process in ("inference", "decode"):
        assert f'vlmq_process_restarts_total{{process="{process}"}} ' in metrics
    check_answers(load.accepted, r, keys)


def check_stream(job: Job, final_text: str) -> None:
    """The streamed tokens: indices 0..n-1 each once, in order (each event starts where the one
    before it ended); their text is the final text."""
    indices, expected = [index for index, _, _ in job.tokens], [0]
    for _, count, _ in job.tokens:
        expected.append(expected[-1] + count)
    assert indices == expected[:-1], (job.job_id, indices)
    assert "".join(text for _, _, text in job.tokens) == final_text, job.job_id
    assert job.final is not None and job.final["type"] == "done"


def check_answers(accepted: list[Job], r: redis.Redis, keys: Keys) -> None:
    """Each answer equals the engine's batch-of-one greedy answer for the job's own request."""
    reference = Reference(str(models.test_model_path()))
    try:
        for job in accepted:
            record = J.job(r, keys, job.job_id)
            assert record.text == reference.answer(record.spec, job.image), job.job_id
    finally:
        reference.close()
