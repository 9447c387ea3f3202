"""Operator commands: ``jobs show|cancel``, ``status``, ``dead-letters list|retry``."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from vlmq_cli.client import Client
from vlmq_cli.tables import ms, ratio, table

STAGES = ("queue", "decode", "wait", "vision", "prefill", "generation", "ttft", "total")


def emit(value: Any, as_json: bool, render: Any) -> int:
    print(json.dumps(value, indent=2) if as_json else render(value))
    return 0


def run_jobs(client: Client, args: argparse.Namespace) -> int:
    if args.action == "cancel":
        answer = client.call("DELETE", f"/v1/jobs/{args.id}")
        done = "cancelled" if answer["status"] == "cancelled" else f"asked to stop ({answer['status']})"
        return emit(answer, args.json, lambda a: f"job {a['id']}: {done}")
    return emit(client.call("GET", f"/v1/jobs/{args.id}"), args.json, render_job)


def render_job(job: dict[str, Any]) -> str:
    usage = job.get("usage") or {}
    lines = [
        f"job      {job['id']}",
        f"status   {job['status']}" + (f" ({job['error']})" if job.get("error") else ""),
        f"session  {job.get('session_id') or '-'}",
        f"text     {job.get('final_text') or job.get('text') or ''}",
        f"tokens   {usage.get('prompt_tokens', 0)} prompt ({usage.get('cached_tokens', 0)} cached), "
        f"{usage.get('completion_tokens', 0)} completion",
    ]
    timings = job.get("timings") or {}
    return "\n".join(lines) + "\n\n" + table(["stage", "time"], [(s, ms(timings.get(s))) for s in STAGES])


def run_status(client: Client, args: argparse.Namespace) -> int:
    return emit(client.call("GET", "/v1/status"), args.json, render_status)


def render_status(status: dict[str, Any]) -> str:
    queues = status["queues"]
    queue_rows = [(f"{name} (decode tasks)", n) for name, n in queues["decode"].items()]
    queue_rows += [("inference backlog", queues["inference"]["backlog"])]
    queue_rows += [("inference in flight", queues["inference"]["in_flight"])]
    workers = [
        (
            w["id"],
            "healthy" if w["healthy"] else "unhealthy",
            w["device"],
            f"{w['in_flight']}/{w['capacity']}",
        )
        for w in status["workers"]
    ]
    caches = [(n, ratio(c["hit_ratio"]), f"{c['hits']}/{c['lookups']}") for n, c in status["caches"].items()]
    parts = [
        f"model {status.get('model', '?')}",
        table(["queue", "jobs"], queue_rows),
        table(["worker", "state", "device", "jobs/capacity"], workers)
        if workers
        else "no inference worker online",
        table(["cache", "hit ratio", "hits/lookups"], caches) if caches else "no cache figures yet",
        render_recent(status.get("recent") or {}),
    ]
    if status.get("flower_url"):
        parts.append(f"Flower: {status['flower_url']}")
    return "\n\n".join(parts)


def render_recent(recent: dict[str, Any]) -> str:
    if not recent.get("jobs"):
        return "recent latency: no job done yet"
    rate = recent.get("tokens_per_s")
    head = f"recent latency: last {recent['jobs']} jobs over {recent['window_s']:.0f} s"
    head += f", {rate:.1f} tokens/s" if rate else ""
    rows = [
        (name, ms(recent[key]["p50"]), ms(recent[key]["p95"]))
        for name, key in (("ttft", "ttft_s"), ("total", "total_s"))
    ]
    return head + "\n" + table(["", "p50", "p95"], rows)


def run_dead_letters(client: Client, args: argparse.Namespace) -> int:
    if args.action == "retry":
        job = client.call("POST", f"/v1/dead-letters/{args.id}/retry")
        return emit(job, args.json, lambda j: f"retried {args.id} as job {j['id']} ({j['status']})")
    letters = client.call("GET", "/v1/dead-letters", params={"limit": args.limit})["data"]
    return emit(letters, args.json, render_dead_letters)


def render_dead_letters(letters: list[dict[str, Any]]) -> str:
    if not letters:
        return "no dead letters"
    rows = [
        (
            d["job_id"],
            d.get("stage", "-"),
            d.get("attempts", "-"),
            _when(d.get("ts")),
            d.get("reason", "")[:60],
        )
        for d in letters
    ]
    return table(["job", "stage", "attempts", "when", "reason"], rows)


def _when(ts: str | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(ts))) if ts else "-"
