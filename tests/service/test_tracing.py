"""Traces across the queue (``VLMQ_OTLP_ENDPOINT``): every process exports OTLP/HTTP to a receiver
run here (``tests.support.otlp``); one job is one trace with spans from the gateway, the decode
worker and the inference worker, under the client's ``traceparent`` or a new trace; and every
process's log lines about the job name it."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.service.conftest import wait_done
from tests.support.jobs import image_bytes
from tests.support.otlp import OtlpReceiver, ReceivedSpan
from tests.support.stack import ServiceStack

CLIENT_TRACE, CLIENT_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
SERVICES = {"vlmq-gateway", "vlmq-decode", "vlmq-inference"}
NO_CACHE = {"Cache-Control": "no-cache"}


@pytest.fixture
def traced(stack_factory: Callable[..., ServiceStack]) -> Iterator[tuple[ServiceStack, OtlpReceiver]]:
    with OtlpReceiver() as receiver:
        env = {"VLMQ_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        yield stack_factory(extra_env=env), receiver


def wait_for_spans(
    spans: Callable[[], list[ReceivedSpan]], names: set[str], timeout_s: float = 30
) -> dict[str, Any]:
    """{name: span} once every name in ``names`` has arrived (each name once)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = [s for s in spans() if s.name in names]  # (FastAPI adds spans of its own)
        if names <= {s.name for s in got}:
            assert len(got) == len(names), [(s.name, s.span_id, s.parent_id, s.attributes) for s in got]
            return {s.name: s for s in got}
        time.sleep(0.2)
    raise TimeoutError(f"spans {sorted(names - {s.name for s in spans()})} never arrived")


def ancestors(span: ReceivedSpan, trace: list[ReceivedSpan]) -> list[str]:
    by_id = {s.span_id: s for s in trace}
    found = []
    while span.parent_id in by_id:
        span = by_id[span.parent_id]
        found.append(span.span_id)
    return found


async def test_one_job_is_one_trace_under_the_clients_traceparent(
    traced: tuple[ServiceStack, OtlpReceiver],
) -> None:
    stack, receiver = traced
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=60) as client:
        resp = await client.post(
            "/v1/jobs",
            data={"prompt": "What colour is the square?", "max_tokens": "8"},
            files={"image": ("i.png", image_bytes("PNG", (160, 160), seed=61), "image/png")},
            headers={**NO_CACHE, "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
        )
        assert resp.status_code == 202 and resp.headers["traceparent"].split("-")[1] == CLIENT_TRACE
        job_id = resp.json()["id"]
        assert (await wait_done(client, job_id))["status"] == "done"
    stages = {"vlmq.queue.decode", "vlmq.decode", "vlmq.queue.inference", "vlmq.inference"}
    engine = {"vlmq.vision", "vlmq.prefill", "vlmq.generation"}
    spans = wait_for_spans(
        lambda: receiver.of_trace(CLIENT_TRACE), {"POST /v1/jobs", "vlmq.submit"} | stages | engine
    )
    assert {s.service for s in spans.values()} == SERVICES
    request, submit, inference = spans["POST /v1/jobs"], spans["vlmq.submit"], spans["vlmq.inference"]
    assert request.parent_id == CLIENT_SPAN  # FastAPI's request span
    assert request.span_id in ancestors(submit, receiver.of_trace(CLIENT_TRACE))
    assert all(spans[name].parent_id == submit.span_id for name in stages)
    assert all(spans[name].parent_id == inference.span_id for name in engine)
    assert {spans[n].service for n in ("vlmq.queue.decode", "vlmq.decode")} == {"vlmq-decode"}
    assert all(s.attributes["vlmq.job_id"] == job_id for s in spans.values() if s is not request)
    assert (
        inference.attributes["vlmq.status"] == "done" and inference.attributes["vlmq.completion_tokens"] > 0
    )
    assert all(s.start_ns <= s.end_ns for s in spans.values())
    for name in ("gateway", "decode", "inference"):
        assert f"job={job_id}" in stack.procs[name].log(), f"{name} never logs the job id"


async def test_a_job_without_traceparent_starts_one_trace(traced: tuple[ServiceStack, OtlpReceiver]) -> None:
    """The OpenAI route, no header: the gateway starts the trace; the workers join it."""
    stack, receiver = traced
    image = base64.b64encode(image_bytes("PNG", (160, 160), seed=62)).decode()
    content = [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}},
        {"type": "text", "text": "What colour is the square?"},
    ]
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=60) as client:
        resp = await client.post(
            "/v1/chat/completions",
            json={"model": "vlmq-tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 8},
            headers=NO_CACHE,
        )
    assert resp.status_code == 200, resp.text
    job_id, trace_id = resp.headers["x-vlmq-job-id"], resp.headers["traceparent"].split("-")[1]
    names = {"POST /v1/chat/completions", "vlmq.submit", "vlmq.decode", "vlmq.inference"}
    spans = wait_for_spans(lambda: receiver.of_trace(trace_id), names)
    assert all(s.attributes["vlmq.job_id"] == job_id for n, s in spans.items() if n.startswith("vlmq."))
    assert {s.trace_id for s in spans.values()} == {trace_id}
    assert {s.service for s in spans.values()} == SERVICES
    assert spans["POST /v1/chat/completions"].parent_id == ""  # a root: nobody sent a traceparent
