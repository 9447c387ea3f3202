"""Latencies of the latest finished jobs: a capped Redis list, newest first (``Keys.recent_jobs``).

The inference worker pushes one entry per job done (in the pipeline of its side effects); the
gateway's ``GET /v1/status`` summarises them as "recent latency" (the web page's status view, the
CLI). Cumulative figures stay Prometheus's part (``/metrics``); this answers "how fast is it now".
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

from shared.keys import Keys
from shared.schemas import StageTimings, UsageInfo

KEEP = 100  # jobs


def record(pipe: Any, keys: Keys, timings: StageTimings | None, usage: UsageInfo | None) -> None:
    """Queue the entry of one finished job on ``pipe`` (sync or async pipeline)."""
    if timings is None:
        return
    entry = {
        "at": round(time.time(), 3),
        "ttft": timings.ttft,
        "total": timings.total,
        "generation": timings.generation,
        "tokens": usage.completion_tokens if usage else 0,
    }
    pipe.lpush(keys.recent_jobs(), json.dumps(entry, separators=(",", ":")))
    pipe.ltrim(keys.recent_jobs(), 0, KEEP - 1)


def summary(raw: list[Any], now: float | None = None) -> dict[str, Any]:
    """LRANGE of the list -> jobs counted, the window they span, TTFT and total p50/p95, tokens/s."""
    entries = [e for e in (_parse(item) for item in raw) if e is not None]
    if not entries:
        return {"jobs": 0}
    now = time.time() if now is None else now
    generating = [e for e in entries if e["generation"] > 0 and e["tokens"] > 1]
    return {
        "jobs": len(entries),
        "window_s": max(0.0, now - min(e["at"] for e in entries)),
        "ttft_s": _percentiles([e["ttft"] for e in entries]),
        "total_s": _percentiles([e["total"] for e in entries]),
        "tokens_per_s": (
            sum(e["tokens"] - 1 for e in generating) / sum(e["generation"] for e in generating)
            if generating
            else None
        ),
    }


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    rank = lambda q: ordered[max(0, math.ceil(q * len(ordered)) - 1)]  # noqa: E731  (nearest rank)
    return {"p50": rank(0.5), "p95": rank(0.95)}


def _parse(item: Any) -> dict[str, float] | None:
    try:
        entry = json.loads(item)
        return {k: float(entry[k]) for k in ("at", "ttft", "total", "generation", "tokens")}
    except (ValueError, TypeError, KeyError):
        return None  # another release's entry: skipped, never an error
