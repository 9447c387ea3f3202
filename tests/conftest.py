"""Test-wide fixtures: a private Redis for the session and the real service stack.

The session's redis-server runs on a free port with no persistence, and every test process
(and every child it starts) gets ``VLMQ_REDIS_URL``/``VLMQ_KEY_PREFIX`` pointing at it, so
tests never touch the Redis of a running ``make up``. Contract: ``runs/READY-stack.txt``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from scripts.redis_launcher import start_redis
from shared.keys import Keys
from tests.support.stack import ALL, ServiceStack, running

SESSION_PREFIX = f"vlmqtest-{uuid.uuid4().hex[:8]}"
os.environ["VLMQ_KEY_PREFIX"] = SESSION_PREFIX  # before any settings object is cached
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _clear_settings_caches() -> None:
    from shared import config

    for getter in (
        config.get_gateway_settings,
        config.get_decode_worker_settings,
        config.get_inference_settings,
    ):
        getter.cache_clear()


@pytest.fixture(scope="session", autouse=True)
def redis_url() -> Iterator[str]:
    """URL of the session's own redis-server; also exported as VLMQ_REDIS_URL."""
    server = start_redis()
    os.environ["VLMQ_REDIS_URL"] = server.url
    _clear_settings_caches()
    yield server.url
    server.stop()


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def keys() -> Keys:
    """A fresh key space per test (keys of other tests never interfere)."""
    return Keys(f"vlmqtest-{uuid.uuid4().hex[:8]}")


@pytest.fixture(scope="session")
def service_stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceStack]:
    """Decode worker + inference worker + gateway, started once per session."""
    stack = ServiceStack(redis_url, tmp_path_factory.mktemp("stack-logs"))
    with running(stack):
        yield stack


@pytest.fixture
def stack_factory(
    redis_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., ServiceStack]]:
    """Start a private stack: ``stack_factory(components=("decode",), extra_env={...})``.

    For tests that change settings or kill processes; stopped at the end of the test.
    """
    started: list[ServiceStack] = []
    request.node._vlmq_stacks = started  # logs attached on failure (hook below)

    def make(
        components: tuple[str, ...] = ALL, extra_env: dict[str, str] | None = None, start: bool = True
    ) -> ServiceStack:
        log_dir = tmp_path / f"stack-{len(started)}"
        log_dir.mkdir()
        stack = ServiceStack(redis_url, log_dir, extra_env=extra_env, components=components)
        started.append(stack)
        if start:
            stack.start()
        return stack

    yield make
    for stack in started:
        stack.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Attach the stack processes' logs to a failing test's report."""
    outcome: Any = yield
    report = outcome.get_result()
    if not report.failed:
        return
    funcargs = getattr(item, "funcargs", {})
    stacks = [v for v in funcargs.values() if isinstance(v, ServiceStack)]
    stacks += list(getattr(item, "_vlmq_stacks", []))
    for stack in stacks:
        report.sections.append((f"service stack logs ({call.when})", stack.logs()))
