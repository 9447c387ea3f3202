"""End-to-end through every real process (``service_stack``: decode worker, inference worker,
gateway) plus, in this process, the reference: the same checkpoint run batch-of-one without
caches (``Engine.generate_sync``) on the tensors the decode path makes from the same bytes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from tests.support.models import test_model_path
from tests.support.reference import Reference
from tests.support.stack import ServiceStack

TERMINAL = {"done", "failed", "cancelled", "expired"}


@pytest.fixture(scope="session")
def reference() -> Iterator[Reference]:
    ref = Reference(str(test_model_path()))
    yield ref
    ref.close()


@pytest.fixture
async def client(service_stack: ServiceStack) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=service_stack.base_url, timeout=60) as c:
        yield c


async def wait_done(client: httpx.AsyncClient, job_id: str, timeout_s: float = 60) -> dict[str, Any]:
    """Poll ``GET /v1/jobs/{id}`` until the job is terminal."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        view = (await client.get(f"/v1/jobs/{job_id}")).json()
        if view["status"] in TERMINAL:
            return view
        await asyncio.sleep(0.05)
    raise TimeoutError(f"job {job_id} not finished after {timeout_s}s: {view}")
