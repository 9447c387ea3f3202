"""``GET /v1/status``: queues, inference workers and their caches, the latency of the latest jobs
(``shared.recent_jobs``) and where Flower is, as JSON (for the web page's status view, the CLI and
load balancers; ``/metrics`` has the cumulative figures for Prometheus)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from fastapi import APIRouter

from gateway.auth import TenantDep
from gateway.deps import StateDep
from gateway.metrics_redis import read_heartbeats
from gateway.queues import read_queues
from shared import recent_jobs

router = APIRouter(tags=["operations"])


@router.get("/v1/status")
async def status(state: StateDep, _tenant: TenantDep) -> dict[str, Any]:
    queues = await read_queues(state.redis, state.keys)
    beats = await read_heartbeats(state.redis, state.keys, state.settings.worker_stale_s)
    recent = await state.redis.lrange(state.keys.recent_jobs(), 0, recent_jobs.KEEP - 1)  # type: ignore[misc]
    return {
        "object": "status",
        "model": state.settings.model_name,
        "queues": {
            "decode": queues.decode,
            "inference": {
                "backlog": queues.inference_backlog,
                "in_flight": queues.inference_in_flight,
                "streams": {name: vars(figures) for name, figures in sorted(queues.inference.items())},
            },
        },
        "workers": [worker_view(beat) for beat in sorted(beats, key=lambda b: str(b.get("worker_id")))],
        "caches": cache_totals(beats),
        "recent": recent_jobs.summary(recent),
        "flower_url": state.settings.flower_url or None,
    }


def worker_view(beat: dict[str, Any]) -> dict[str, Any]:
    engine = beat.get("engine") or {}
    return {
        "id": beat.get("worker_id"),
        "healthy": bool(beat.get("healthy")),
        "stopping": bool(beat.get("stopping")),
        "model": beat.get("model"),
        "device": beat.get("device"),
        "in_flight": beat.get("inflight", 0),
        "capacity": beat.get("capacity", 0),
        "running": engine.get("running", 0),
        "waiting": engine.get("waiting", 0),
        "caches": {name: _ratio(c) for name, c in (engine.get("caches") or {}).items()},
    }


def cache_totals(beats: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Hits and lookups per cache over every worker, with the hit ratio."""
    totals: dict[str, dict[str, float]] = defaultdict(lambda: {"hits": 0, "misses": 0})
    for beat in beats:
        for name, cache in ((beat.get("engine") or {}).get("caches") or {}).items():
            totals[name]["hits"] += cache.get("hits", 0)
            totals[name]["misses"] += cache.get("misses", 0)
    return {name: _ratio(c) for name, c in sorted(totals.items())}


def _ratio(cache: dict[str, Any]) -> dict[str, Any]:
    hits, misses = cache.get("hits", 0), cache.get("misses", 0)
    lookups = hits + misses
    return {"hits": hits, "lookups": lookups, "hit_ratio": hits / lookups if lookups else None}
