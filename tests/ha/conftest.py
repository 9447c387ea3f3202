"""A real master + replica + sentinel per test (``tests/support/sentinel.py``); their logs are
attached to a failing test's report."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.sentinel import SentinelCluster, start_cluster


@pytest.fixture
def cluster(request: pytest.FixtureRequest) -> Iterator[SentinelCluster]:
    started = start_cluster()
    request.node._vlmq_cluster = started
    yield started
    started.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome: Any = yield
    report = outcome.get_result()
    cluster = getattr(item, "_vlmq_cluster", None)
    if report.failed and cluster is not None:
        report.sections.append((f"redis + sentinel logs ({call.when})", cluster.logs()))
