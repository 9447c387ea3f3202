"""Workers survive a Redis restart: both keep running and serve the next job."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.redis_launcher import RedisServer, start_redis
from shared.schemas import JobStatus
from tests.services.inference_worker.conftest import STACK_ENV
from tests.services.inference_worker.test_inference_worker import finished, submit
from tests.support.stack import ServiceStack, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def own_redis() -> Iterator[list[RedisServer]]:
    servers = [start_redis()]
    yield servers
    servers[-1].stop()


def test_workers_reconnect_after_redis_restart(own_redis: list[RedisServer], tmp_path: Path) -> None:
    with ServiceStack(
        own_redis[0].url, tmp_path, extra_env=STACK_ENV, components=("decode", "inference")
    ) as stack:
        assert finished(stack, submit(stack, max_tokens=4).job_id) is JobStatus.DONE
        port = own_redis[0].port
        own_redis[0].stop()
        time.sleep(2.0)  # both workers see connection errors
        own_redis.append(start_redis(port=port))  # empty: no persistence in tests
        wait_for(stack.worker_alive, 30, what="inference heartbeat after the restart")
        spec = submit(stack, max_tokens=4, seed=1)
        assert finished(stack, spec.job_id, 60) is JobStatus.DONE
        assert stack.procs["decode"].alive() and stack.procs["inference"].alive()
