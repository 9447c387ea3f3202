"""What a benchmark run costs the machine: CPU seconds and minor page faults per process kind, Redis
memory per job, and the engine's own counters (model-forward CPU, batch sizes) from the inference
worker's heartbeat.

CPU and faults come from ``/proc/<pid>/stat`` (user + system; ``minflt``) of every process in a
component's process group (the Celery main process and its pool children together), Redis's CPU
from ``INFO cpu`` (its own CPU, children included), the load generator's from ``getrusage`` of the
bench process itself (every thread). Readings are taken before and after a run; the difference
divided by the run's requests is CPU-milliseconds (faults) per request. Minor faults count first
touches of fresh memory: a process whose caches or heap still grow pays them on each request's
path (the inference worker's decoded-image cache did, 164 a request, until it kept uint8 pictures).
"""

from __future__ import annotations

import os
import resource
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared import workers

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_usage(pid: int) -> tuple[float, int]:
    """User + system CPU seconds and minor page faults of one process (all its threads); zeros when
    it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0, 0
    # minflt, utime, stime: fields 10, 14, 15 of proc(5); here counted from the state (field 3)
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS, int(fields[7])


def group_usage(pgid: int) -> tuple[float, int]:
    """CPU seconds and minor page faults of every live process in the process group ``pgid``."""
    cpu, faults = 0.0, 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    one_cpu, one_faults = process_usage(int(entry.name))
                    cpu, faults = cpu + one_cpu, faults + one_faults
            except OSError:
                continue
    return cpu, faults


def own_usage() -> tuple[float, int]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime, usage.ru_minflt


def redis_cpu_s(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


STACK = ("gateway", "decode", "inference", "redis")  # the service's processes (no load generator, no peer)


@dataclass
class Reading:
    """One instant: CPU seconds and minor faults per process kind (no faults for Redis: not a
    process of the stack's groups), Redis ``used_memory``, the engines' counters."""

    cpu_s: dict[str, float]
    used_memory: int
    engine: dict[str, Any] = field(default_factory=dict)
    faults: dict[str, int] = field(default_factory=dict)


class Meter:
    """Readings of a stack (``groups``: component name -> process-group id) and its Redis."""

    def __init__(self, client: Any, keys: Any, groups: dict[str, int]) -> None:
        self.client, self.keys, self.groups = client, keys, groups

    def read(self, fresh_after: float | None = None) -> Reading:
        """``fresh_after``: wait (up to 5 s) for heartbeats written after that time (their counters
        then cover everything the engines did before it)."""
        engine = self.engine_counters(fresh_after)
        kinds = {name.split("-")[0] for name in self.groups}
        cpu, faults = dict.fromkeys(kinds, 0.0), dict.fromkeys(kinds, 0)
        for name, pgid in self.groups.items():
            group_cpu, group_faults = group_usage(pgid)
            cpu[name.split("-")[0]] += group_cpu
            faults[name.split("-")[0]] += group_faults
        cpu["redis"] = redis_cpu_s(self.client)
        cpu["loadgen"], faults["loadgen"] = own_usage()
        return Reading(cpu, int(self.client.info("memory")["used_memory"]), engine, faults)

    def engine_counters(self, fresh_after: float | None) -> dict[str, Any]:
        deadline = time.monotonic() + 5.0
        while True:
            beats = workers.live_sync(self.client, self.keys, 60.0, time.time())
            if (
                fresh_after is None
                or all(float(b["ts"]) > fresh_after for b in beats)
                or time.monotonic() > deadline
            ):
                return summed_engines(beats)
            time.sleep(0.1)


def summed_engines(beats: list[dict[str, Any]]) -> dict[str, Any]:
    """Every worker's engine counters added up (one worker in the service bench)."""
    out: dict[str, Any] = {
        "forward_cpu_s": 0.0,
        "step_cpu_s": 0.0,
        "batch_sizes": Counter(),
        "prefill_sizes": Counter(),
    }
    for beat in beats:
        engine = beat.get("engine") or {}
        out["forward_cpu_s"] += float(engine.get("forward_cpu_s", 0.0))
        out["step_cpu_s"] += float(engine.get("step_cpu_s", 0.0))
        for name in ("batch_sizes", "prefill_sizes"):
            out[name].update({int(k): int(v) for k, v in (engine.get(name) or {}).items()})
    return out


def cost(before: Reading, after: Reading, requests: int) -> dict[str, Any]:
    """CPU-ms per request by process kind, Redis bytes per job, engine CPU and batch shares."""
    n = max(requests, 1)
    cpu_ms = {k: 1000 * (after.cpu_s[k] - before.cpu_s.get(k, 0.0)) / n for k in after.cpu_s}
    faults = {k: (after.faults[k] - before.faults.get(k, 0)) / n for k in after.faults}
    e0, e1 = before.engine, after.engine
    decode = Counter(e1.get("batch_sizes", {})) - Counter(e0.get("batch_sizes", {}))
    prefill = Counter(e1.get("prefill_sizes", {})) - Counter(e0.get("prefill_sizes", {}))
    forward_ms = 1000 * (e1.get("forward_cpu_s", 0.0) - e0.get("forward_cpu_s", 0.0)) / n
    steps = sum(decode.values()) + sum(prefill.values())
    ge4 = sum(c for size, c in (decode + prefill).items() if size >= 4)
    return {
        "cpu_ms": cpu_ms,
        "minor_faults": faults,
        "forward_cpu_ms": forward_ms,
        "outside_forward_cpu_ms": sum(cpu_ms.get(k, 0.0) for k in STACK) - forward_ms,
        "engine_step_cpu_ms": 1000 * (e1.get("step_cpu_s", 0.0) - e0.get("step_cpu_s", 0.0)) / n,
        "redis_bytes_per_job": (after.used_memory - before.used_memory) / n,
        "steps": steps,
        "steps_ge4": ge4 / steps if steps else None,
        "decode_batch_sizes": dict(sorted(decode.items())),
        "prefill_steps": sum(prefill.values()),
        "prefill_seqs_per_step": sum(k * c for k, c in prefill.items()) / max(sum(prefill.values()), 1),
    }


def memory_by_kind(client: Any, prefix: str) -> dict[str, tuple[int, int]]:
    """(keys, bytes) per kind of key under ``prefix``: ``MEMORY USAGE`` of every key (bench only:
    it walks the keyspace). The kind is the key's name with ids and digests left out."""
    out: dict[str, list[int]] = {}
    batch: list[bytes] = []
    for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        batch.append(key)
        if len(batch) == 500:
            _measure(client, batch, prefix, out)
            batch = []
    _measure(client, batch, prefix, out)
    return {kind: (v[0], v[1]) for kind, v in out.items()}


def _measure(client: Any, batch: list[bytes], prefix: str, out: dict[str, list[int]]) -> None:
    pipe = client.pipeline(transaction=False)
    for key in batch:
        pipe.memory_usage(key, samples=0)
    for key, size in zip(batch, pipe.execute(), strict=True):
        slot = out.setdefault(key_kind(key.decode(), prefix), [0, 0])
        slot[0] += 1
        slot[1] += int(size or 0)


def key_kind(key: str, prefix: str) -> str:
    """``vlmq:job:<id>:events`` -> ``job:*:events``; ``vlmq:img:<digest>`` -> ``img:*``."""
    parts = key.removeprefix(prefix + ":").split(":")
    kind = parts[0]
    if kind == "celery":
        return "celery:" + parts[1].split(".")[0] if len(parts) > 1 else kind
    if kind in ("job", "img", "tensor", "pixels", "result", "session", "owner", "worker", "tenant"):
        tail = [p for p in parts[2:] if not _is_id(p)]
        return ":".join([kind, "*", *tail]) if len(parts) > 1 else kind
    return kind


def _is_id(part: str) -> bool:
    return len(part) >= 12 and any(c.isdigit() for c in part)
