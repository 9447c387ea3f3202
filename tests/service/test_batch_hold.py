"""Batch work is held service-wide while an interactive job is in flight: the gateway records each
interactive job it admits (with the end of its hold), its terminal write removes it, and inference
workers stop stepping batch rows meanwhile; the rows resume exactly where they stopped.

The random-init model never emits EOS: a batch job runs all its ``max_tokens`` steps, long enough
to watch it stop and resume.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.support.jobs import events, image_bytes
from tests.support.models import random_model_path
from tests.support.stack import ServiceStack

KEYS = "key-web tenant=web\nkey-bulk tenant=bulk priority=batch\n"
HOLD_S = 30.0
JPEG = image_bytes("JPEG", (96, 96), seed=3)


def submit(stack: ServiceStack, key: str, max_tokens: int) -> str:
    headers = {"Authorization": f"Bearer {key}"}
    files = {"image": ("a.jpg", JPEG, "image/jpeg")}
    data = {"prompt": "What colour is the circle?", "max_tokens": str(max_tokens)}
    resp = httpx.post(f"{stack.base_url}/v1/jobs", data=data, files=files, headers=headers)
    assert resp.status_code == 202, resp.text
    return str(resp.json()["id"])


def tokens(stack: ServiceStack, job_id: str) -> int:
    return sum(len(e.token_ids or []) for e in events(stack.redis, stack.keys, job_id) if e.type == "token")


def wait_for(check: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def status(stack: ServiceStack, job_id: str) -> str:
    return str(stack.redis.hget(stack.keys.job(job_id), "status").decode())


def test_interactive_jobs_in_flight_hold_batch_work(
    stack_factory: Callable[..., ServiceStack], tmp_path: Path
) -> None:
    (tmp_path / "keys").write_text(KEYS)
    env = {
        "VLMQ_API_KEYS_FILE": str(tmp_path / "keys"),
        "VLMQ_MODEL": str(random_model_path()),
        "VLMQ_BATCH_HOLD_S": str(HOLD_S),
    }
    stack = stack_factory(components=("decode", "inference", "gateway"), extra_env=env)
    held = stack.keys.interactive_jobs()

    # the gateway records an interactive job with the end of its hold; its terminal write removes it
    before = time.time()
    web = submit(stack, "key-web", 2)
    score = stack.redis.zscore(held, stack.keys.job(web))
    assert score is None or before + HOLD_S <= score <= time.time() + HOLD_S  # None: already done
    wait_for(lambda: status(stack, web) == "done")
    assert stack.redis.zscore(held, stack.keys.job(web)) is None
    bulk = submit(stack, "key-bulk", 2)
    wait_for(lambda: status(stack, bulk) == "done")
    assert stack.redis.zcard(held) == 0  # batch jobs hold nothing

    # a long batch job stops while an interactive job is in flight, and goes on when its hold ends
    long_batch = submit(stack, "key-bulk", 400)
    wait_for(lambda: tokens(stack, long_batch) >= 5)
    stack.redis.zadd(held, {stack.keys.job("decoding-somewhere"): time.time() + 2.0})
    time.sleep(0.3)  # the worker looks every 5 ms; a step in flight may still end
    paused_at = tokens(stack, long_batch)
    time.sleep(1.0)
    assert tokens(stack, long_batch) == paused_at < 400
    wait_for(lambda: status(stack, long_batch) == "done")  # its hold ended at 2 s: batch work resumed
    assert tokens(stack, long_batch) == 400
