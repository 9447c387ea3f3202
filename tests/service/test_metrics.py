"""``/metrics`` by Prometheus conventions, read with prometheus-client's parser after one real job
per submission route (``POST /v1/jobs``, OpenAI's chat completions, ``WS /v1/chat/ws``)."""

from __future__ import annotations

import base64
import itertools
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import connect

from tests.service.conftest import wait_done
from tests.support.jobs import image_bytes
from tests.support.stack import ServiceStack

NO_CACHE = {"Cache-Control": "no-cache"}
ROUTES = ("jobs", "openai", "ws")

# Every vlmq family /metrics has, and its type (the parser names a counter without its _total).
COUNTERS = {
    "vlmq_gateway_jobs_submitted",
    "vlmq_gateway_requests_rejected",
    "vlmq_gateway_result_cache_lookups",
    "vlmq_gateway_result_cache_hits",
    "vlmq_gateway_auth_failures",
    "vlmq_jobs",
    "vlmq_sweeper_actions",
    "vlmq_decode_claimed_jobs",
    "vlmq_process_restarts",
    "vlmq_engine_steps",
    "vlmq_engine_prefill_steps",
    "vlmq_engine_decode_steps",
    "vlmq_engine_mixed_steps",
    "vlmq_prompt_tokens",
    "vlmq_prompt_tokens_cached",
    "vlmq_generation_tokens",
    "vlmq_engine_requests_submitted",
    "vlmq_engine_requests_rejected",
    "vlmq_engine_requests_finished",
    "vlmq_engine_errors",
    "vlmq_engine_forward_cpu_seconds",
    "vlmq_engine_step_cpu_seconds",
    "vlmq_engine_prompt_cpu_seconds",
    "vlmq_cache_hits",
    "vlmq_cache_lookups",
    "vlmq_cache_evictions",
    "vlmq_image_inputs_returned",
}
GAUGES = {
    "vlmq_gateway_open_streams",
    "vlmq_queue_depth",
    "vlmq_inference_backlog",
    "vlmq_workers_alive",
    "vlmq_worker_healthy",
    "vlmq_worker_jobs_in_flight",
    "vlmq_worker_jobs_capacity",
    "vlmq_worker_info",
    "vlmq_num_requests_running",
    "vlmq_num_requests_waiting",
    "vlmq_engine_max_batch",
    "vlmq_engine_failed_steps_in_a_row",
    "vlmq_cache_entries",
    "vlmq_cache_bytes",
    "vlmq_cache_capacity_bytes",
}
# histogram -> the least count one job on each route adds (labels that must carry it)
JOB_HISTOGRAMS: dict[str, tuple[int, dict[str, str]]] = {
    "vlmq_time_to_first_token_seconds": (3, {}),
    "vlmq_e2e_request_latency_seconds": (3, {}),
    "vlmq_inter_token_latency_seconds": (3, {}),  # descriptions: several token events each
    "vlmq_request_queue_time_seconds": (3, {"stage": "decode"}),
    "vlmq_request_image_decode_time_seconds": (3, {}),
    "vlmq_request_vision_time_seconds": (3, {}),
    "vlmq_request_prefill_time_seconds": (3, {}),
    "vlmq_request_decode_time_seconds": (3, {}),
    "vlmq_request_prompt_tokens": (3, {}),
    "vlmq_request_generation_tokens": (3, {}),
    "vlmq_engine_batch_size": (1, {}),  # decode steps: three short jobs may share one batch
    "vlmq_engine_prefill_batch_size": (1, {}),
}
HISTOGRAMS = {*JOB_HISTOGRAMS, "vlmq_gateway_submit_seconds"}


async def test_metrics_typed_and_filled_by_one_job_per_route(
    client: httpx.AsyncClient, service_stack: ServiceStack
) -> None:
    before = await read(client)
    image = image_bytes("PNG", (200, 160), seed=41)
    await via_jobs(client, image)
    await via_openai(service_stack, image)
    await via_ws(service_stack, image)
    deadline = time.monotonic() + 30  # worker side effects and heartbeats land just after "done"
    while missing := unfilled(before, after := await read(client)):
        assert time.monotonic() < deadline, f"not filled by one job per route: {missing}"
        time.sleep(0.2)
    assert_typed(after)
    for route in ROUTES:
        gained = total(after, "vlmq_gateway_jobs_submitted_total", route=route)
        assert gained - total(before, "vlmq_gateway_jobs_submitted_total", route=route) >= 1, route


def unfilled(before: dict[str, Metric], after: dict[str, Metric]) -> list[str]:
    """The histograms (with labels) that did not gain their count between the two reads."""
    missing = []
    for family, (least, labels) in JOB_HISTOGRAMS.items():
        name = f"{family}_count"
        if total(after, name, **labels) - total(before, name, **labels) < least:
            missing.append(f"{family}{labels}")
    for route in ROUTES:
        name = "vlmq_gateway_submit_seconds_count"
        if total(after, name, route=route) - total(before, name, route=route) < 1:
            missing.append(f"vlmq_gateway_submit_seconds{{route={route}}}")
    return missing


def assert_typed(families: dict[str, Metric]) -> None:
    """Every vlmq family has its declared type; counters end in _total; histograms are whole."""
    vlmq = {name: f for name, f in families.items() if name.startswith("vlmq_")}
    declared = {**dict.fromkeys(COUNTERS, "counter"), **dict.fromkeys(GAUGES, "gauge")}
    declared |= dict.fromkeys(HISTOGRAMS, "histogram")
    assert {n: f.type for n, f in vlmq.items()} == declared
    for family in vlmq.values():
        names = {s.name.removeprefix(family.name) for s in family.samples}
        if family.type == "counter":
            assert names <= {"_total", "_created"}, (family.name, names)
        elif family.type == "histogram":
            assert_histogram(family)
        else:
            assert names <= {""}, (family.name, names)


def assert_histogram(family: Metric) -> None:
    """Per label set: buckets ascending by ``le`` never decrease, and ``+Inf`` equals ``_count``."""
    for labels, samples in by_labels(family):
        buckets = sorted((float(s.labels["le"]), s.value) for s in samples if s.name.endswith("_bucket"))
        counts = [s.value for s in samples if s.name.endswith("_count")]
        assert buckets and buckets[-1][0] == float("inf"), (family.name, labels)
        assert all(a[1] <= b[1] for a, b in itertools.pairwise(buckets)), (family.name, labels)
        assert counts == [buckets[-1][1]], (family.name, labels)


def by_labels(family: Metric) -> Iterator[tuple[dict[str, str], list[Any]]]:
    groups: dict[tuple[tuple[str, str], ...], list[Any]] = {}
    for sample in family.samples:
        key = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
        groups.setdefault(key, []).append(sample)
    for key, samples in groups.items():
        if any(s.name.endswith("_bucket") for s in samples):
            yield dict(key), samples


def total(families: dict[str, Metric], sample: str, **labels: str) -> float:
    """Sum of the samples called ``sample`` whose labels include ``labels``."""
    return sum(
        s.value
        for f in families.values()
        for s in f.samples
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
    )


async def read(client: httpx.AsyncClient) -> dict[str, Metric]:
    resp = await client.get("/metrics")
    assert resp.status_code == 200
    return {f.name: f for f in text_string_to_metric_families(resp.text)}


async def via_jobs(client: httpx.AsyncClient, image: bytes) -> None:
    resp = await client.post(
        "/v1/jobs",
        data={"prompt": "Describe the picture.", "max_tokens": "12"},
        files={"image": ("i.png", image, "image/png")},
        headers=NO_CACHE,
    )
    assert resp.status_code == 202, resp.text
    assert (await wait_done(client, resp.json()["id"]))["status"] == "done"


async def via_openai(stack: ServiceStack, image: bytes) -> None:
    url = "data:image/png;base64," + base64.b64encode(image).decode()
    content: Any = [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "Describe the picture."},
    ]
    async with openai.AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key="sk-none") as oai:
        answer = await oai.chat.completions.create(
            model="vlmq-tiny",
            messages=[{"role": "user", "content": content}],
            max_tokens=12,
            extra_headers=NO_CACHE,
        )
    assert answer.choices[0].finish_reason in ("stop", "length")


async def via_ws(stack: ServiceStack, image: bytes) -> None:
    url = "data:image/png;base64," + base64.b64encode(image).decode()
    job = {"prompt": "Describe the picture.", "image": url, "max_tokens": 12, "no_cache": True}
    async with connect(f"{stack.ws_url}/v1/chat/ws") as ws:
        await ws.send(json.dumps(job))
        while (message := json.loads(await ws.recv()))["type"] not in ("done", "error"):
            pass
    assert message["type"] == "done", message
