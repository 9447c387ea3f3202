"""Soak: sustained load at ~70 % of measured capacity; memory, Redis keys and latency stay flat.

    python -m bench.soak_bench [--minutes 10] [--fraction 0.7]

One stack (gateway, one decode worker, one inference worker, the bundled model, its own Redis)
with short lifetimes so that "back to baseline after the TTLs" is seen within the run:
VLMQ_JOB_TTL_S=120, VLMQ_IMAGE_TTL_S=60, VLMQ_SESSION_TTL_S=60, VLMQ_RESULT_CACHE_TTL_S=60,
VLMQ_MAX_JOB_S=60 (everything else default). Steps:

1. capacity: 8 closed-loop clients for 30 s -> jobs/s;
2. soak: open-loop Poisson arrivals at ``fraction`` x capacity for ``minutes``; every job
   multipart JPEG, 16 tokens, no result cache, followed to its terminal record;
3. drain: wait the longest TTL plus a margin, then count Redis keys again.

Sampled every 10 s: RSS of every process (a Celery node with its children), Redis
``used_memory`` and key count. Reported: per-minute p50/p99 and throughput, RSS growth of each
process over the second half (the first half is warm-up: the inference worker's engine caches
fill to their byte bounds there, ~500 MB with the defaults, growth by design) and, for
transparency, from the end of minute 1; keys at baseline / peak / after the drain. Writes
bench/results/soak_bench.{json,md}. Exits 1 when a job was lost (not terminal), an RSS grew by
>= 10 % after warm-up, or keys did not return to baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.service_workload import MAX_TOKENS, BenchRequest, make_requests, pct
from scripts.redis_launcher import start_redis
from tests.support.stack import ServiceStack

RESULTS = Path(__file__).resolve().parent / "results"
TTLS = {
    "VLMQ_JOB_TTL_S": "120",
    "VLMQ_IMAGE_TTL_S": "60",
    "VLMQ_SESSION_TTL_S": "60",
    "VLMQ_RESULT_CACHE_TTL_S": "60",
    "VLMQ_MAX_JOB_S": "60",
}
ENV = {**TTLS, "VLMQ_DECODE_CONCURRENCY": "1", "OMP_NUM_THREADS": "1", "VLMQ_LOG_LEVEL": "WARNING"}
SAMPLE_S = 10.0
MAX_RSS_GROWTH = 0.10
TERMINAL = ("done", "failed", "cancelled")
SLOW_S = 1.0  # jobs slower than this (client-side) keep their stage timings in the report
SLOW: list[dict[str, Any]] = []


async def one_job(client: httpx.AsyncClient, request: BenchRequest) -> tuple[float, float, str]:
    """(start, seconds to terminal, status) of one job."""
    started = time.perf_counter()
    resp = await client.post(
        "/v1/jobs",
        data={"prompt": request.question, "max_tokens": str(MAX_TOKENS)},
        files={"image": ("i.jpg", request.image, "image/jpeg")},
        headers={"Cache-Control": "no-cache"},
    )
    if resp.status_code != 202:
        return started, time.perf_counter() - started, f"http {resp.status_code}"
    job_id, deadline = resp.json()["id"], started + 120  # VLMQ_MAX_JOB_S is 60: never longer
    while (view := (await client.get(f"/v1/jobs/{job_id}")).json())["status"] not in TERMINAL:
        if time.perf_counter() > deadline:
            return started, time.perf_counter() - started, "lost"
        await asyncio.sleep(0.02)
    seconds = time.perf_counter() - started
    if seconds >= SLOW_S:  # where a slow job's time went, by the server's stage timings
        SLOW.append({"seconds": seconds, "id": job_id, "timings": view.get("timings")})
    return started, seconds, str(view["status"])


async def capacity(client: httpx.AsyncClient, requests: list[BenchRequest], seconds: float) -> float:
    end, done = time.perf_counter() + seconds, 0

    async def closed_loop(offset: int) -> None:
        nonlocal done
        i = offset
        while time.perf_counter() < end:
            await one_job(client, requests[i % len(requests)])
            done, i = done + 1, i + 8

    started = time.perf_counter()
    await asyncio.gather(*(closed_loop(k) for k in range(8)))
    return done / (time.perf_counter() - started)


def process_rss(stack: ServiceStack) -> dict[str, int]:
    """RSS bytes of each stack process, with its children (Celery's pool)."""
    out = {}
    for name, managed in stack.procs.items():
        try:
            proc = psutil.Process(managed.pid)
            out[name] = sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)])
        except psutil.NoSuchProcess:
            out[name] = 0
    return out


def sample(stack: ServiceStack, t0: float) -> dict[str, Any]:
    info = stack.redis.info("memory")
    return {
        "t": time.perf_counter() - t0,
        "rss": process_rss(stack),
        "keys": stack.redis.dbsize(),
        "used_memory": info["used_memory"],
    }


async def soak(stack: ServiceStack, client: httpx.AsyncClient, rate: float, minutes: float) -> dict[str, Any]:
    requests, rng = make_requests(64, seed=11), random.Random(5)
    SLOW.clear()  # the capacity run's are not the soak's
    t0, samples, tasks = time.perf_counter(), [], []
    next_sample, i = 0.0, 0
    while (now := time.perf_counter() - t0) < minutes * 60:
        if now >= next_sample:
            samples.append(await asyncio.to_thread(sample, stack, t0))
            next_sample += SAMPLE_S
        tasks.append(asyncio.create_task(one_job(client, requests[i % len(requests)])))
        i += 1
        await asyncio.sleep(rng.expovariate(rate))
    results = await asyncio.gather(*tasks)
    samples.append(await asyncio.to_thread(sample, stack, t0))
    return {"results": [(s - t0, d, st) for s, d, st in results], "samples": samples}


def per_minute(results: list[tuple[float, float, str]]) -> list[dict[str, Any]]:
    minutes: dict[int, list[float]] = {}
    for start, seconds, status in results:
        if status == "done":
            minutes.setdefault(int(start // 60), []).append(seconds)
    return [
        {"minute": m, "jobs": len(v), "p50_s": pct(v, 50), "p99_s": pct(v, 99)}
        for m, v in sorted(minutes.items())
    ]


def rss_growth(samples: list[dict[str, Any]], from_s: float) -> dict[str, float]:
    """Growth of each process's RSS from the first sample at or after ``from_s`` to the last."""
    warm = next((s for s in samples if s["t"] >= from_s), samples[0])
    last = samples[-1]
    return {name: last["rss"][name] / warm["rss"][name] - 1 for name in last["rss"] if warm["rss"].get(name)}


async def drive(stack: ServiceStack, minutes: float, fraction: float) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=120) as client:
        cap = await capacity(client, make_requests(32, seed=3), 30)
        await asyncio.sleep(float(TTLS["VLMQ_JOB_TTL_S"]) + 15)  # the capacity run's keys expire first
        baseline = stack.redis.dbsize()
        soaked = await soak(stack, client, cap * fraction, minutes)
    await asyncio.sleep(float(TTLS["VLMQ_JOB_TTL_S"]) + 15)
    return {
        "capacity_jobs_per_s": cap,
        "rate_jobs_per_s": cap * fraction,
        "keys_baseline": baseline,
        "keys_after_ttls": stack.redis.dbsize(),
        **soaked,
    }


def summarize(raw: dict[str, Any], minutes: float, fraction: float) -> dict[str, Any]:
    results, samples = raw.pop("results"), raw["samples"]
    statuses: dict[str, int] = {}
    for _, _, status in results:
        statuses[status] = statuses.get(status, 0) + 1
    return {
        "minutes": minutes,
        "fraction": fraction,
        "settings": TTLS,
        **raw,
        "jobs": len(results),
        "statuses": statuses,
        "per_minute": per_minute(results),
        "slow_jobs": len(SLOW),
        "slowest": sorted(SLOW, key=lambda job: -job["seconds"])[:20],
        # warm-up = the first half: the engine's caches (session KV 512 MB, image 256 MB, prefix
        # 64 MB by default) fill to their bounds in it, which is growth by design
        "rss_growth_after_warmup": rss_growth(samples, minutes * 30),
        "rss_growth_after_minute_1": rss_growth(samples, 60),
        "keys_peak": max(s["keys"] for s in samples),
        "used_memory_peak": max(s["used_memory"] for s in samples),
        "load_average_end": " ".join(Path("/proc/loadavg").read_text().split()[:3]),
    }


def report(s: dict[str, Any]) -> str:
    lines = [
        f"capacity {s['capacity_jobs_per_s']:.1f} jobs/s; soak at {s['rate_jobs_per_s']:.1f} jobs/s for "
        f"{s['minutes']} min: {s['jobs']} jobs {s['statuses']}",
        f"Redis keys: baseline {s['keys_baseline']}, peak {s['keys_peak']}, "
        f"after the TTLs {s['keys_after_ttls']}; "
        f"used_memory peak {s['used_memory_peak'] / 1e6:.1f} MB",
        f"jobs slower than {SLOW_S:.0f} s: {s['slow_jobs']} (stage timings of the slowest 20 in the JSON)",
        "RSS growth in the second half (after warm-up): "
        + ", ".join(f"{k} {v * 100:+.1f} %" for k, v in s["rss_growth_after_warmup"].items()),
        "RSS growth after minute 1 (engine caches filling to their bounds included): "
        + ", ".join(f"{k} {v * 100:+.1f} %" for k, v in s["rss_growth_after_minute_1"].items()),
        "",
        "| minute | jobs | p50 (s) | p99 (s) |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {m['minute']} | {m['jobs']} | {m['p50_s']:.3f} | {m['p99_s']:.3f} |" for m in s["per_minute"]
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--fraction", type=float, default=0.7, help="of the measured capacity")
    args = parser.parse_args()
    redis_server = start_redis()
    stack = ServiceStack(redis_server.url, Path(tempfile.mkdtemp(prefix="vlmq-soak-")), extra_env=ENV)
    try:
        stack.start(timeout_s=180)
        summary = summarize(
            asyncio.run(drive(stack, args.minutes, args.fraction)), args.minutes, args.fraction
        )
    finally:
        stack.stop()
        redis_server.stop()
    print(report(summary))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "soak_bench.json").write_text(json.dumps(summary, indent=2))
    (RESULTS / "soak_bench.md").write_text(report(summary) + "\n")
    lost = summary["statuses"].get("lost", 0) > 0
    grew = any(g >= MAX_RSS_GROWTH for g in summary["rss_growth_after_warmup"].values())
    return 1 if lost or grew or summary["keys_after_ttls"] > summary["keys_baseline"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
