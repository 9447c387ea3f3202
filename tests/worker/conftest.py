"""A real Celery decode worker (prefork, -c 1) shared by this module's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.stack import ServiceStack, running


@pytest.fixture(scope="module")
def decode_stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceStack]:
    logs = tmp_path_factory.mktemp("decode-logs")  # task events on: as where Flower runs (make up)
    # a task waits 2 s for the next job (default 1 s): the tests of that wait stand a stalled host
    stack = ServiceStack(
        redis_url, logs, components=("decode",), task_events=True, extra_env={"VLMQ_DECODE_LINGER_S": "2"}
    )
    with running(stack):
        yield stack
