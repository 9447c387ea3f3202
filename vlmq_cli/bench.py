"""``vlmq bench``: load the service with a closed loop of jobs (``--concurrency`` clients, each sending
its next job when the last one ended), over the jobs API with the result cache bypassed, a progress
bar on stderr, then a results table: throughput and client-side TTFT and latency percentiles.

The workload is the server's own gallery (``/static/examples.json`` and ``/examples/*``: the images
and questions the bundled model knows) unless ``--image``/``--question`` say otherwise."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from vlmq_cli.ask import is_terminal
from vlmq_cli.client import CliError, headers_for, server_message
from vlmq_cli.tables import ms, table

NO_CACHE = {"Cache-Control": "no-cache"}


@dataclass(frozen=True)
class Work:
    name: str
    image: bytes
    question: str


@dataclass
class Sample:
    status: str  # done, failed, cancelled, expired, or "refused: <HTTP status>" / "error"
    total_s: float
    ttft_s: float | None = None
    tokens: int = 0
    error: str | None = None


async def workload(http: httpx.AsyncClient, args: argparse.Namespace) -> list[Work]:
    if args.image:
        path = Path(args.image)
        if not path.is_file():
            raise CliError(f"{path}: no such file", code=2)
        return [Work(path.name, path.read_bytes(), args.question or "What is in the picture?")]
    gallery = (await http.get("/static/examples.json")).json()["examples"]
    work = []
    for example in gallery:
        image = (await http.get(f"/examples/{example['file']}")).content
        work += [Work(example["file"], image, args.question or q) for q, _answer in example["questions"]]
    return work


async def lines_to_events(lines: AsyncIterator[str]) -> AsyncIterator[dict[str, Any]]:
    data: list[str] = []
    async for line in lines:
        if line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif not line and data:
            yield json.loads("\n".join(data))
            data = []


async def one_job(http: httpx.AsyncClient, work: Work, args: argparse.Namespace) -> Sample:
    start = time.perf_counter()
    form = {"prompt": work.question, "max_tokens": str(args.max_tokens)}
    if args.ignore_eos:
        form["ignore_eos"] = "true"
    files = {"image": (work.name, work.image, "application/octet-stream")}
    response = await http.post("/v1/jobs", data=form, files=files, headers=NO_CACHE)
    if response.status_code != 202:
        error = f"{response.status_code} {server_message(response)}"
        return Sample(f"refused: {response.status_code}", time.perf_counter() - start, error=error)
    return await stream(http, response.json()["id"], start)


async def stream(http: httpx.AsyncClient, job_id: str, start: float) -> Sample:
    sample = Sample("error", 0.0, error="the stream ended before the job")
    async with http.stream("GET", f"/v1/jobs/{job_id}/events") as events:
        async for event in lines_to_events(events.aiter_lines()):
            if event.get("type") == "token" and sample.ttft_s is None:
                sample.ttft_s = time.perf_counter() - start
            if is_terminal(event):
                status = "done" if event.get("type") == "done" else str(event.get("status"))
                sample.status, sample.error = status, event.get("error")
                sample.tokens = (event.get("usage") or {}).get("completion_tokens", 0)
                break
    sample.total_s = time.perf_counter() - start
    return sample


async def closed_loop(args: argparse.Namespace) -> tuple[list[Sample], float]:
    limits = httpx.Limits(max_connections=args.concurrency * 2 + 4)
    async with httpx.AsyncClient(
        base_url=args.url.rstrip("/"), headers=headers_for(args.key), timeout=args.timeout, limits=limits
    ) as http:
        work = await workload(http, args)
        left = list(range(args.jobs))
        samples: list[Sample] = []
        bar = tqdm(total=args.jobs, unit="job", desc="bench", disable=args.quiet)

        async def client() -> None:
            while left:
                index = left.pop()
                try:
                    samples.append(await one_job(http, work[index % len(work)], args))
                except httpx.HTTPError as exc:
                    samples.append(Sample("error", 0.0, error=f"{type(exc).__name__}: {exc}"))
                bar.update(1)

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(args.concurrency)))
        bar.close()
        return samples, time.perf_counter() - start


def percentile(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] if ordered else None


def results(samples: list[Sample], wall_s: float, args: argparse.Namespace) -> dict[str, Any]:
    done = [s for s in samples if s.status == "done"]
    latency = {
        name: {f"p{int(q * 100)}": percentile(values, q) for q in (0.5, 0.95, 0.99)}
        | {"max": max(values, default=None)}
        for name, values in (
            ("ttft_s", [s.ttft_s for s in done if s.ttft_s is not None]),
            ("total_s", [s.total_s for s in done]),
        )
    }
    return {
        "jobs": len(samples),
        "concurrency": args.concurrency,
        "outcomes": dict(Counter(s.status for s in samples)),
        "errors": dict(Counter(s.error for s in samples if s.error and s.status != "done").most_common(5)),
        "wall_s": wall_s,
        "jobs_per_s": len(done) / wall_s if wall_s else None,
        "tokens_per_s": sum(s.tokens for s in done) / wall_s if wall_s else None,
        "latency": latency,
        "samples": [asdict(s) for s in samples] if args.samples else None,
    }


def render(report: dict[str, Any]) -> str:
    outcomes = ", ".join(f"{n} {status}" for status, n in sorted(report["outcomes"].items()))
    head = [
        ("jobs", f"{report['jobs']} ({outcomes}) at concurrency {report['concurrency']}"),
        ("wall time", f"{report['wall_s']:.2f} s"),
        ("throughput", f"{report['jobs_per_s'] or 0:.2f} jobs/s, {report['tokens_per_s'] or 0:.1f} tokens/s"),
    ]
    lines = [f"{k:<12}{v}" for k, v in head]
    rows = [
        (name, *(ms(report["latency"][key][p]) for p in ("p50", "p95", "p99", "max")))
        for name, key in (("TTFT", "ttft_s"), ("latency", "total_s"))
    ]
    errors = [f"  {n} x {message}" for message, n in report["errors"].items()]
    return "\n".join(
        [
            *lines,
            "",
            table(["", "p50", "p95", "p99", "max"], rows),
            *(["", "errors:", *errors] if errors else []),
        ]
    )


def run_bench(args: argparse.Namespace) -> int:
    if args.jobs < 1 or args.concurrency < 1:
        raise CliError("--jobs and --concurrency must be at least 1", code=2)
    samples, wall_s = asyncio.run(closed_loop(args))
    report = results(samples, wall_s, args)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0 if report["outcomes"].get("done", 0) == len(samples) else 1
