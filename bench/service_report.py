"""The service benchmark's report: tables and the issue's ratios from ``bench.service_bench``'s result."""

from __future__ import annotations

import statistics
from typing import Any

from bench.resources import STACK
from bench.service_workload import MAX_TOKENS

HOPS = {
    "gateway_in": "client send -> job accepted (WS frame, JSON, base64, sha256, JobSpec)",
    "queue": "accepted -> decode started (MULTI writes, Celery LPUSH, broker pickup)",
    "decode": "image bytes -> pixels stored (Pillow, resize)",
    "wait": "pixels handed over -> engine admission (stream wake, job + pixels load, normalise, prompt)",
    "engine": "vision + prefill + generation (the engine's own timings)",
    "worker_other": "rest of the server total (token/finish writes, gaps between engine stages)",
    "stream_out": "terminal event written -> client has it (XREAD wake, WS send)",
}
PROCESSES = ("gateway", "decode", "inference", "redis", "loadgen", "peer")


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def run_of(result: dict[str, Any], mode: str, concurrency: int, repeat: int = 1) -> dict[str, Any] | None:
    return next(
        (
            r
            for r in result["runs"]
            if r["mode"] == mode and r["concurrency"] == concurrency and r.get("repeat", 1) == repeat
        ),
        None,
    )


RATIO_LABELS = {  # each ratio of vlmq-openai to the peer, as the report names it
    "throughput": "throughput",
    "e2e_p50": "e2e p50",
    "e2e_p99": "e2e p99",
    "e2e_p99_after_ramp": "e2e p99 after the ramp",
    "ttft_p50": "TTFT p50",
}


def ratios(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per level: vlmq-openai vs peer-openai on the same requests (throughput, p50 and p99 e2e, p99
    after the ramp, TTFT p50), each the median over the interleaved repeats, with every repeat's."""
    rows = []
    for c in result["levels"]:
        each = [r for k in range(1, result.get("repeats", 1) + 1) if (r := _ratios_of(result, c, k))]
        if each:
            median = {name: statistics.median(r[name] for r in each) for name in RATIO_LABELS}
            rows.append({"concurrency": c, **median, "repeats": each})
    return rows


def _ratios_of(result: dict[str, Any], c: int, repeat: int) -> dict[str, float] | None:
    ours, peer = run_of(result, "vlmq-openai", c, repeat), run_of(result, "peer-openai", c, repeat)
    if not ours or not peer or not peer["summary"]["qps"] or not ours["summary"]["qps"]:
        return None
    o, p = ours["summary"], peer["summary"]
    return {
        "throughput": o["qps"] / p["qps"],
        "e2e_p50": o["e2e_p50"] / p["e2e_p50"],
        "e2e_p99": o["e2e_p99"] / p["e2e_p99"],
        "e2e_p99_after_ramp": (o.get("e2e_p99_after_ramp") or 0) / (p.get("e2e_p99_after_ramp") or 1),
        "ttft_p50": (o["ttft_p50"] or 0) / (p["ttft_p50"] or 1),
    }


def server(row: dict[str, Any], result: dict[str, Any]) -> str:
    return f"{row['mode']}{repeat_suffix(row, result)}"


def repeat_suffix(row: dict[str, Any], result: dict[str, Any]) -> str:
    """The run's repeat (" #2") where there are several."""
    return "" if result.get("repeats", 1) == 1 else f" #{row.get('repeat', 1)}"


def head(result: dict[str, Any]) -> list[str]:
    return [
        f"# Service benchmark ({result['when']}, {result['machine']})",
        "",
        f"model `{result['model']}` (sha256 {result.get('model_sha256', '?')[:16]}), "
        f"max_tokens {MAX_TOKENS}, "
        "greedy, JPEG 320-1024 px, closed loop. Load average before "
        f"{result.get('load_before', '?')}, after {result.get('load_after', '?')}.",
        "",
        "| server | conc | req | QPS | e2e p50 | p90 | p99 | TTFT p50 | p90 | p99 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]


def latency_rows(result: dict[str, Any]) -> list[str]:
    lines = []
    for row in result["runs"]:
        s = row["summary"]
        lines.append(
            f"| {server(row, result)} | {row['concurrency']} | {s['requests']} | {s['qps']:.2f} | "
            f"{ms(s['e2e_p50'])} | {ms(s['e2e_p90'])} | {ms(s['e2e_p99'])} | {ms(s['ttft_p50'])} | "
            f"{ms(s['ttft_p90'])} | {ms(s['ttft_p99'])} |"
        )
    n = result.get("repeats", 1)
    how = "one run" if n == 1 else f"the median of {n} interleaved runs, each run's in brackets"
    lines += ["", f"Ratios vlmq-openai / peer-openai (same requests, {how}):", ""]
    for r in ratios(result):
        cells = [f"{label} {_ratio(r, name)}" for name, label in RATIO_LABELS.items()]
        lines.append(f"- c={r['concurrency']}: " + ", ".join(cells))
    lines += [
        "",
        "p99 after the ramp: each client's first request left out (all clients start at once, so the "
        "first round meets a cold pipeline's burst).",
    ]
    return lines


def _ratio(row: dict[str, Any], name: str) -> str:
    text = f"{row[name]:.2f}x"
    if len(row["repeats"]) > 1:
        text += " [" + " ".join(f"{r[name]:.2f}" for r in row["repeats"]) + "]"
    return text


def stage_rows(result: dict[str, Any]) -> list[str]:
    names = result["stage_names"]
    lines = [
        "",
        "Times in ms. vlmq per-stage p50 (vlmq-ws, server-side):",
        "",
        "| conc | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for row in result["runs"]:
        if row["mode"] == "vlmq-ws" and "stages_p50" in row["summary"]:
            stages = row["summary"]["stages_p50"]
            conc = f"{row['concurrency']}{repeat_suffix(row, result)}"
            lines.append(f"| {conc} | " + " | ".join(ms(stages[k]) for k in names) + " |")
    lines += [
        "",
        "Per hop at concurrency 1 (vlmq-ws; ms):",
        "",
        "| hop | p50 | p90 | what |",
        "|---|---|---|---|",
    ]
    for name, what in HOPS.items():
        hop = result["hops_c1"][name]
        lines.append(f"| {name} | {ms(hop['p50'])} | {ms(hop['p90'])} | {what} |")
    return lines


def cost_rows(result: dict[str, Any]) -> list[str]:
    """CPU-ms per request by process, the model forward's share, batching, Redis bytes per job."""
    lines = [
        "",
        "CPU-milliseconds per request by process (`/proc` of each process group; Redis: INFO cpu; "
        "loadgen: the bench process), the inference worker's model-forward CPU (engine thread inside "
        "prefill/decode), steps with >= 4 sequences, prefill batch, Redis `used_memory` growth per job:",
        "",
        "| server | conc | " + " | ".join(PROCESSES) + " | vlmq total | forward | outside forward "
        "| steps >=4 seqs | seqs/prefill | Redis B/job |",
        "|---|---|" + "---|" * (len(PROCESSES) + 6),
    ]
    for row in result["runs"]:
        c = row.get("cost")
        if not c:
            continue
        cpu = c["cpu_ms"]
        ours = sum(cpu.get(k, 0.0) for k in STACK)
        share = "-" if c["steps_ge4"] is None else f"{c['steps_ge4']:.0%}"
        cells = [f"{cpu.get(k, 0.0):.1f}" for k in PROCESSES]
        lines.append(
            f"| {server(row, result)} | {row['concurrency']} | " + " | ".join(cells) + f" | {ours:.1f} | "
            f"{c['forward_cpu_ms']:.1f} | {ours - c['forward_cpu_ms']:.1f} | {share} | "
            f"{c['prefill_seqs_per_step']:.1f} | {c['redis_bytes_per_job']:.0f} |"
        )
    return lines


FAULTING = ("gateway", "decode", "inference", "loadgen", "peer")  # Redis: not one of the groups


def fault_rows(result: dict[str, Any]) -> list[str]:
    """Minor page faults per request by process: first touches of fresh memory (a growing cache or
    heap pays them on the request's path)."""
    rows = [row for row in result["runs"] if (row.get("cost") or {}).get("minor_faults")]
    if not rows:
        return []
    lines = [
        "",
        "Minor page faults per request by process (`/proc/<pid>/stat` of each process group; first "
        "touches of fresh memory):",
        "",
        "| server | conc | " + " | ".join(FAULTING) + " |",
        "|---|---|" + "---|" * len(FAULTING),
    ]
    for row in rows:
        faults = row["cost"]["minor_faults"]
        cells = [f"{faults[k]:.0f}" if k in faults else "-" for k in FAULTING]  # "-": not read
        lines.append(f"| {server(row, result)} | {row['concurrency']} | " + " | ".join(cells) + " |")
    return lines


def memory_rows(result: dict[str, Any]) -> list[str]:
    m = result.get("memory")
    if not m:
        return []
    lines = [
        "",
        f"Redis memory, sustained load: {m['jobs']} jobs in {m['seconds']:.0f} s at "
        f"{m['concurrency']} clients (vlmq-openai, default settings). `used_memory` "
        f"{m['used_before'] / 1e6:.1f} -> {m['used_after'] / 1e6:.1f} MB (peak {m['used_peak'] / 1e6:.1f}): "
        f"{m['bytes_per_job'] / 1e3:.1f} KB per job, {m['bytes_per_job_without_images'] / 1e3:.1f} KB "
        "per job without the uploaded image bytes.",
        "",
        "| key kind | new keys | bytes added (MEMORY USAGE) | per job |",
        "|---|---|---|---|",
    ]
    for kind, (count, size) in sorted(m["by_kind"].items(), key=lambda kv: -kv[1][1]):
        lines.append(f"| {kind} | {count} | {size} | {size / max(m['jobs'], 1):.0f} |")
    return lines


def tail(result: dict[str, Any]) -> list[str]:
    o = result["overhead"]
    return [
        "",
        f"Pipeline overhead at concurrency 1 (vlmq-ws e2e minus engine-only, each request through "
        f"both back to back): "
        f"p50 {ms(o['overhead_p50'])} ms, p90 {ms(o['overhead_p90'])} ms "
        f"(engine-only p50 {ms(o['engine_p50'])} ms, e2e p50 {ms(o['e2e_p50'])} ms).",
        f"Answers: vlmq vs transformers serve identical {result['agreement']['identical']}/"
        f"{result['agreement']['compared']}; vlmq vs engine-only identical "
        f"{result['engine_agreement']['identical']}/{result['engine_agreement']['compared']}.",
    ]


def markdown(result: dict[str, Any]) -> str:
    parts = head(result) + latency_rows(result) + stage_rows(result) + cost_rows(result) + fault_rows(result)
    return "\n".join(parts + memory_rows(result) + tail(result)) + "\n"
