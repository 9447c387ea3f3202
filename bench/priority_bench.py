"""Priority benchmark: an interactive tenant's latency while another tenant floods batch jobs.

    python -m bench.priority_bench [--quick | --smoke] [--out DIR]

One stack as `make up` runs it (gateway, a decode node for interactive work, a niced decode node for
batch work, one inference worker, the bundled model) with two keys:
tenant ``web`` (interactive) and tenant ``bulk`` (batch priority). Phases, in one run:

1. unloaded: ``web`` sends N jobs one after another (multipart JPEG, 16 tokens, no result
   cache) and records each one's end-to-end latency (submit -> terminal job record);
2. flood: ``bulk`` runs 32 closed loops (submit, follow the job's SSE stream to its end, submit
   again; in its own process, so that it does not slow the measuring client), a standing backlog
   of 32 batch jobs, while ``web`` sends N jobs of new pictures; the loops stop when
   ``web`` is done and every batch job they started is waited for;
3. control: as 2, but the flood comes from a third key of ``interactive`` priority, to show
   what the priorities buy.

The issue's bound: under the batch flood, ``web``'s p50 within 2x its unloaded p50, and every
batch job finishes. A benchmark figure, not a test: the ratio is printed and written to
bench/results/priority_bench{,_quick,_smoke}.{json,md}; exits 1 only when a batch job did not finish.
``--smoke`` (3 interactive jobs a phase; seconds, measures nothing) is what ``make test`` runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.service_workload import MAX_TOKENS, BenchRequest, make_requests, pct
from scripts.redis_launcher import start_redis
from tests.support.stack import ServiceStack

RESULTS = Path(__file__).resolve().parent / "results"
KEYS = {
    "web": "web-key-0123456789abcdef",
    "bulk": "bulk-key-0123456789abcdef",
    "rival": "rival-0123456789abcdef",
}
KEYS_FILE = (
    f"{KEYS['web']} tenant=web priority=interactive\n"
    f"{KEYS['bulk']} tenant=bulk priority=batch\n"
    f"{KEYS['rival']} tenant=rival priority=interactive\n"
)
ENV = {"VLMQ_DECODE_CONCURRENCY": "1", "OMP_NUM_THREADS": "1", "VLMQ_LOG_LEVEL": "WARNING"}
TERMINAL = {"done", "failed", "cancelled"}
FLOODERS = 32  # concurrent batch clients: the backlog the interactive tenant has to pass


async def submit(client: httpx.AsyncClient, tenant: str, request: BenchRequest) -> str:
    resp = await client.post(
        "/v1/jobs",
        data={"prompt": request.question, "max_tokens": str(MAX_TOKENS)},
        files={"image": ("i.jpg", request.image, "image/jpeg")},
        headers={"Authorization": f"Bearer {KEYS[tenant]}", "Cache-Control": "no-cache"},
    )
    resp.raise_for_status()
    return str(resp.json()["id"])


async def wait_terminal(client: httpx.AsyncClient, tenant: str, job_id: str, poll_s: float = 0.01) -> str:
    return str((await terminal_view(client, tenant, job_id, poll_s))["status"])


async def terminal_view(client: httpx.AsyncClient, tenant: str, job_id: str, poll_s: float) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {KEYS[tenant]}"}
    while True:
        view: dict[str, Any] = (await client.get(f"/v1/jobs/{job_id}", headers=headers)).json()
        if view["status"] in TERMINAL:
            return view
        await asyncio.sleep(poll_s)


STAGES = ("queue", "decode", "wait", "prefill", "generation", "ttft", "total")


WEB_CLIENT = {"mode": "stream"}  # how ``web`` learns a job ended: its SSE stream, or polling


async def interactive(client: httpx.AsyncClient, requests: list[BenchRequest]) -> list[float]:
    """End-to-end seconds of each ``web`` job, sent one after another (their server-side stage
    timings are kept in STAGE_LOG for the report)."""
    latencies = []
    for request in requests:
        started = time.perf_counter()
        job_id = await submit(client, "web", request)
        if WEB_CLIENT["mode"] == "stream":
            await follow_events(client, "web", job_id)
        view = await terminal_view(client, "web", job_id, 0.01)
        assert view["status"] == "done", view["status"]
        latencies.append(time.perf_counter() - started)
        STAGE_LOG.append({k: v for k, v in (view.get("timings") or {}).items() if k in STAGES})
    return latencies


STAGE_LOG: list[dict[str, float]] = []


def stage_medians() -> dict[str, float | None]:
    """Median of each stage over STAGE_LOG, which is then emptied (one phase's jobs)."""
    medians = {k: pct([t[k] for t in STAGE_LOG if t.get(k) is not None], 50) for k in STAGES}
    STAGE_LOG.clear()
    return medians


async def follow_to_end(client: httpx.AsyncClient, tenant: str, job_id: str) -> str:
    """Read the job's SSE stream until its terminal event: the client learns of the end at once (so
    the loop submits again at once) without polling the gateway."""
    await follow_events(client, tenant, job_id)
    return await wait_terminal(client, tenant, job_id)  # the record, once


async def follow_events(client: httpx.AsyncClient, tenant: str, job_id: str) -> None:
    headers = {"Authorization": f"Bearer {KEYS[tenant]}"}
    async with client.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers) as resp:
        async for line in resp.aiter_lines():
            if line.startswith("data:"):
                event = json.loads(line.removeprefix("data:").strip())
                if event["type"] in ("done", "error") or event.get("status") in TERMINAL:
                    break


async def flood(
    client: httpx.AsyncClient, tenant: str, requests: list[BenchRequest], stop: Any, started: Any
) -> list[str]:
    """FLOODERS closed loops (submit, follow to the end, again) until ``stop``: a standing backlog of
    FLOODERS jobs, whatever the service's capacity."""
    statuses: list[str] = []

    async def flooder(offset: int) -> None:
        i = offset
        while not stop.is_set():
            job_id = await submit(client, tenant, requests[i % len(requests)])
            started.set()
            statuses.append(await follow_to_end(client, tenant, job_id))
            i += FLOODERS

    await asyncio.gather(*(flooder(k) for k in range(FLOODERS)))
    return statuses


def flood_process(base_url: str, tenant: str, flood_n: int, stop: Any, started: Any, out: Any) -> None:
    """The flood in its own process: parsing 32 SSE streams must not slow the measuring client."""

    async def main() -> list[str]:
        limits = httpx.Limits(max_connections=4 * FLOODERS)
        async with httpx.AsyncClient(base_url=base_url, timeout=300, limits=limits) as client:
            return await flood(client, tenant, make_requests(flood_n, seed=8), stop, started)

    out.put(asyncio.run(main()))


async def flooded(
    client: httpx.AsyncClient, tenant: str, web: list[BenchRequest], flood_n: int
) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    stop, started, out = context.Event(), context.Event(), context.Queue()
    began = time.perf_counter()
    flooder = context.Process(
        target=flood_process, args=(str(client.base_url), tenant, flood_n, stop, started, out)
    )
    flooder.start()
    await asyncio.to_thread(started.wait, 60)
    await asyncio.sleep(2.0)  # the backlog builds up first
    latencies = await interactive(client, web)
    stop.set()
    statuses: list[str] = await asyncio.to_thread(out.get, True, 300)
    flooder.join(30)
    return {
        "flood_tenant": tenant,
        "web_p50_s": pct(latencies, 50),
        "web_p90_s": pct(latencies, 90),
        "flood_jobs": len(statuses),
        "flood_done": sum(s == "done" for s in statuses),
        "wall_s": time.perf_counter() - began,
        "web_stage_medians_s": stage_medians(),
    }


async def drive(stack: ServiceStack, web_n: int, flood_n: int) -> dict[str, Any]:
    """Each phase sends pictures of its own (seeds 7, 17, 27): a picture seen before skips its
    decode and vision work (content-addressed tensors, image cache), which would flatter the later
    phases against the first."""
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=300) as client:
        await interactive(client, make_requests(3, seed=99))  # warm-up
        STAGE_LOG.clear()
        unloaded = await interactive(client, make_requests(web_n, seed=7))
        unloaded_stages = stage_medians()
        batch = await flooded(client, "bulk", make_requests(web_n, seed=17), flood_n)
        control = await flooded(client, "rival", make_requests(web_n, seed=27), flood_n)
    base = pct(unloaded, 50)
    return {
        "unloaded_web_p50_s": base,
        "unloaded_web_p90_s": pct(unloaded, 90),
        "unloaded_web_stage_medians_s": unloaded_stages,
        "under_batch_flood": {**batch, "ratio_to_unloaded": batch["web_p50_s"] / base},
        "under_interactive_flood": {**control, "ratio_to_unloaded": control["web_p50_s"] / base},
    }


def run(web_n: int, flood_n: int, batch_hold_s: float | None = None) -> dict[str, Any]:
    redis_server = start_redis()
    keys_file = Path(tempfile.mkdtemp(prefix="vlmq-prio-")) / "keys"
    keys_file.write_text(KEYS_FILE)
    env = {**ENV, "VLMQ_API_KEYS_FILE": str(keys_file), "VLMQ_MAX_QUEUE_DEPTH": str(4 * FLOODERS)}
    if batch_hold_s is not None:
        env["VLMQ_BATCH_HOLD_S"] = str(batch_hold_s)
    components = ("decode", "decode-batch", "inference", "gateway")  # as `make up` runs them
    stack = ServiceStack(redis_server.url, keys_file.parent, extra_env=env, components=components)
    try:
        stack.start(timeout_s=180)
        return asyncio.run(drive(stack, web_n, flood_n))
    finally:
        stack.stop()
        redis_server.stop()


def report(result: dict[str, Any]) -> str:
    rows = ["| flood from | web p50 (s) | × unloaded | web p90 (s) | flood done |", "|---|---|---|---|---|"]
    rows.append(
        f"| none | {result['unloaded_web_p50_s']:.3f} | 1.00 | {result['unloaded_web_p90_s']:.3f} | – |"
    )
    phases = [("none", result["unloaded_web_stage_medians_s"])]
    for name in ("under_batch_flood", "under_interactive_flood"):
        r = result[name]
        rows.append(
            f"| {r['flood_tenant']} ({name.split('_')[1]}) | {r['web_p50_s']:.3f} | "
            f"{r['ratio_to_unloaded']:.2f} | {r['web_p90_s']:.3f} | {r['flood_done']}/{r['flood_jobs']} |"
        )
        phases.append((r["flood_tenant"], r["web_stage_medians_s"]))
    rows += [
        "",
        "web jobs' median server-side stage times (s):",
        "",
        "| flood from | " + " | ".join(STAGES) + " |",
    ]
    rows.append("|---" * (len(STAGES) + 1) + "|")
    for who, medians in phases:
        cells = [f"{medians[k]:.3f}" if medians.get(k) is not None else "–" for k in STAGES]
        rows.append(f"| {who} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10 interactive jobs instead of 40")
    parser.add_argument("--smoke", action="store_true", help="3 interactive jobs a phase: every code path")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON and table")
    parser.add_argument(
        "--web-client",
        choices=("stream", "poll"),
        default="stream",
        help="web learns of each job's end from its SSE stream (as the page does), or by polling every 10 ms",
    )
    parser.add_argument(
        "--batch-hold-s", type=float, default=None, help="VLMQ_BATCH_HOLD_S for the stack (default: its own)"
    )
    args = parser.parse_args()
    WEB_CLIENT["mode"] = args.web_client
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    web_n, flood_n = {"smoke": (3, 8), "quick": (10, 64), "full": (40, 64)}[mode]
    result = {
        **run(web_n, flood_n, args.batch_hold_s),
        "web_client": args.web_client,
        "batch_hold_s": args.batch_hold_s,
    }
    table = report(result)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    name = "priority_bench" if mode == "full" else f"priority_bench_{mode}"
    (args.out / f"{name}.json").write_text(json.dumps({**result, "mode": mode}, indent=2))
    (args.out / f"{name}.md").write_text(table + "\n")
    floods = (result["under_batch_flood"], result["under_interactive_flood"])
    return 0 if all(f["flood_done"] == f["flood_jobs"] for f in floods) else 1


if __name__ == "__main__":
    raise SystemExit(main())
