"""Fuzz through the gateway (issue 15): every hostile image of ``corpus()`` is sent on the jobs
route (multipart) and the OpenAI route (data URL) of the real stack (gateway, decode worker,
inference worker). Each must end as a clear 4xx in OpenAI's error shape, or as a job that ends
``failed`` with ``bad_image`` (OpenAI: a 400) or ``done``; never a 5xx, a hang (10 s guard per
case) or a crashed process. Prints the slowest gateway answer and the slowest case end to end."""

from __future__ import annotations

import asyncio
import base64
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.fuzz.corpus import Case, corpus
from tests.support.stack import ServiceStack

pytestmark = pytest.mark.slow

GUARD_S = 10.0
AT_ONCE = 4
CLIENT_ERRORS = {400, 413, 415, 422}
TERMINAL = {"done", "failed", "cancelled", "expired"}


@dataclass
class Outcome:
    case: str
    route: str
    result: str  # "4xx:<status>:<code>", "failed:<error_code>", "done", or a problem
    answer_s: float  # until the gateway's first answer (202 or a refusal; OpenAI: the whole request)
    total_s: float  # until the job's end

    @property
    def ok(self) -> bool:
        return self.result == "done" or self.result.startswith(("4xx:", "failed:bad_image"))


def error_code(resp: httpx.Response) -> str:
    error = resp.json()["error"]
    assert error["message"] and error["type"], error
    return str(error["code"])


async def via_jobs(client: httpx.AsyncClient, case: Case) -> Outcome:
    started = time.perf_counter()
    files = {"image": ("upload.png", case.data, "application/octet-stream")}
    resp = await client.post("/v1/jobs", data={"prompt": "What is it?", "max_tokens": "1"}, files=files)
    answered = time.perf_counter() - started
    if resp.status_code != 202:
        return Outcome(case.name, "jobs", status_result(resp), answered, answered)
    job_id = resp.json()["id"]
    while (view := (await client.get(f"/v1/jobs/{job_id}")).json())["status"] not in TERMINAL:
        await asyncio.sleep(0.02)
    result = "done" if view["status"] == "done" else f"{view['status']}:{view['error_code']}"
    return Outcome(case.name, "jobs", result, answered, time.perf_counter() - started)


async def via_openai(client: httpx.AsyncClient, case: Case, model: str) -> Outcome:
    url = "data:image/png;base64," + base64.b64encode(case.data).decode()
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What is it?"}]
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 1}
    started = time.perf_counter()
    resp = await client.post("/v1/chat/completions", json=body, headers={"Cache-Control": "no-cache"})
    elapsed = time.perf_counter() - started
    result = "done" if resp.status_code == 200 else status_result(resp)
    return Outcome(case.name, "openai", result, elapsed, elapsed)


def status_result(resp: httpx.Response) -> str:
    if resp.status_code in CLIENT_ERRORS:
        return f"4xx:{resp.status_code}:{error_code(resp)}"
    return f"unexpected HTTP {resp.status_code}: {resp.text[:200]}"


async def guarded(route: str, name: str, run: Any) -> Outcome:
    try:
        return await asyncio.wait_for(run, GUARD_S)
    except TimeoutError:
        return Outcome(name, route, f"hang: no end after {GUARD_S} s", GUARD_S, GUARD_S)
    except Exception as exc:  # a dropped connection is a gateway crash as far as a client can tell
        return Outcome(name, route, f"{type(exc).__name__}: {exc}", 0.0, 0.0)


async def test_hostile_images_through_the_gateway(service_stack: ServiceStack) -> None:
    cases = corpus()
    assert len(cases) >= 300
    model = service_stack.settings.model_name
    gate = asyncio.Semaphore(AT_ONCE)
    async with httpx.AsyncClient(base_url=service_stack.base_url, timeout=GUARD_S + 5) as client:

        async def both(case: Case) -> list[Outcome]:
            async with gate:
                return [
                    await guarded("jobs", case.name, via_jobs(client, case)),
                    await guarded("openai", case.name, via_openai(client, case, model)),
                ]

        outcomes = [o for pair in await asyncio.gather(*(both(c) for c in cases)) for o in pair]
    report(outcomes)
    bad = [o for o in outcomes if not o.ok]
    assert not bad, "\n".join(f"{o.route} {o.case}: {o.result}" for o in bad[:20])
    for name, proc in service_stack.procs.items():
        assert proc.alive(), f"{name} died during the fuzz run"
    gateway_log = service_stack.procs["gateway"].log()
    assert "Traceback" not in gateway_log and "Exception in ASGI" not in gateway_log


def report(outcomes: list[Outcome]) -> None:
    """Counts by result; the slowest gateway answer (jobs route: the gateway's own work, up to the
    202 or the refusal) and the slowest case end to end (decode and one token of inference included)."""
    counts = Counter(o.result[:40] for o in outcomes)
    print(f"\nfuzz: {len(outcomes) // 2} cases x 2 routes: {dict(sorted(counts.items()))}")
    answer = max((o for o in outcomes if o.route == "jobs"), key=lambda o: o.answer_s)
    total = max(outcomes, key=lambda o: o.total_s)
    print(f"slowest gateway answer: {answer.case} {answer.answer_s * 1000:.0f} ms ({answer.result})")
    print(
        f"slowest case end to end: {total.route} {total.case} {total.total_s * 1000:.0f} ms ({total.result})"
    )
