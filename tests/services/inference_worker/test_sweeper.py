"""The sweeper: an accepted job reaches a terminal state even when its task or its stream entry is
lost, or nobody reads it past its deadline (real workers, real Redis, a short ``stuck_after_s``)."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest

from shared.schemas import JobStatus
from tests.services.inference_worker.conftest import STACK_ENV
from tests.services.inference_worker.test_inference_worker import finished
from tests.support import jobs as J
from tests.support.stack import ServiceStack, wait_for

pytestmark = pytest.mark.slow
SWEEP_ENV = {**STACK_ENV, "VLMQ_STUCK_AFTER_S": "2", "VLMQ_MAX_DECODE_ATTEMPTS": "2"}


def queued_job(stack: ServiceStack, **spec_args: object) -> str:
    """A job as the gateway leaves it, whose decode task was lost (never enqueued)."""
    data = J.image_bytes("PNG", (96, 96), seed=int(time.time() * 1000) % 997)
    spec = J.make_spec(digest=J.store_image(stack.redis, stack.keys, data), max_tokens=4, **spec_args)  # type: ignore[arg-type]
    return J.create_job(stack.redis, stack.keys, spec)


def test_a_lost_decode_task_is_enqueued_again(stack_factory: Callable[..., ServiceStack]) -> None:
    stack = stack_factory(components=("decode", "inference"), extra_env=SWEEP_ENV)
    job_id = queued_job(stack)
    assert finished(stack, job_id, 60) is JobStatus.DONE
    assert int(stack.redis.hget(stack.keys.job(job_id), "decode_enqueues")) == 1
    assert stack.redis.zcard(stack.keys.active_jobs()) == 0


def test_lost_stream_entries_are_added_again(stack_factory: Callable[..., ServiceStack]) -> None:
    """DEL of the inference stream (or FLUSHDB of it, or eviction): the worker recreates its group
    and carries on; the jobs whose entries went with it are enqueued again and finish."""
    stack = stack_factory(components=("decode", "inference"), extra_env=SWEEP_ENV)
    stack.kill("inference")  # jobs pile up as waiting
    jobs = [queued_job(stack) for _ in range(3)]
    for job_id in jobs:
        stack.enqueue_decode(job_id)
    wait_for(lambda: stack.redis.xlen(stack.keys.inference_stream()) == 3, 60, what="jobs handed over")
    stack.redis.delete(stack.keys.inference_stream())
    stack.restart("inference")
    for job_id in jobs:
        assert finished(stack, job_id, 90) is JobStatus.DONE
    stack.redis.delete(stack.keys.inference_stream())  # again, under a running worker
    later = queued_job(stack)
    stack.enqueue_decode(later)
    assert finished(stack, later, 90) is JobStatus.DONE
    assert stack.procs["inference"].alive()


def test_jobs_nobody_moves_are_dead_lettered_then_retried_by_an_operator(
    stack_factory: Callable[..., ServiceStack],
) -> None:
    stack = stack_factory(components=("inference", "gateway"), extra_env=SWEEP_ENV)  # no decode worker
    job_id = queued_job(stack)
    assert finished(stack, job_id, 60) is JobStatus.FAILED
    record = J.job(stack.redis, stack.keys, job_id)
    assert record.error_code == "internal" and "dead letter" in (record.error or "")
    assert stack.redis.llen(stack.keys.decode_queue()) == 2  # enqueued twice (the cap), never run
    listed = httpx.get(f"{stack.base_url}/v1/dead-letters").json()["data"]
    assert [(d["job_id"], d["stage"], d["status"]) for d in listed] == [(job_id, "decode", "failed")]
    stack.redis.delete(stack.keys.decode_queue())
    env = {**SWEEP_ENV, "VLMQ_KEY_PREFIX": stack.key_prefix}
    stack_factory(components=("decode",), extra_env=env)  # the operator brings decoding back
    retry = httpx.post(f"{stack.base_url}/v1/dead-letters/{job_id}/retry")
    assert retry.status_code == 202 and retry.json()["retry_of"] == job_id
    new_id = retry.json()["id"]
    assert new_id != job_id and J.job_status(stack.redis, stack.keys, job_id) is JobStatus.FAILED
    assert httpx.post(f"{stack.base_url}/v1/dead-letters/{new_id}/retry").status_code == 409
    assert httpx.post(f"{stack.base_url}/v1/dead-letters/{'0' * 32}/retry").status_code == 404
    decode = stack_factory(
        components=("decode",), extra_env={**SWEEP_ENV, "VLMQ_KEY_PREFIX": stack.key_prefix}
    )
    assert decode.procs["decode"].alive()
    assert finished(stack, new_id, 90) is JobStatus.DONE


def test_a_job_nobody_reads_expires_at_its_deadline(stack_factory: Callable[..., ServiceStack]) -> None:
    stack = stack_factory(components=("inference",), extra_env=SWEEP_ENV)
    job_id = queued_job(stack, deadline=time.time() + 1)
    assert finished(stack, job_id, 30) is JobStatus.EXPIRED
    assert "deadline passed while queued" in (J.job(stack.redis, stack.keys, job_id).error or "")
