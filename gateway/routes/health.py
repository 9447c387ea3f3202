"""``/healthz`` (process alive), ``/readyz`` (can serve), ``/metrics`` (Prometheus)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis.exceptions
from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from gateway.auth import TenantDep
from gateway.deps import StateDep
from gateway.metrics_redis import read_heartbeats
from gateway.state import GatewayState

router = APIRouter(tags=["health"])

REDIS_CHECK_S = 2.0


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


def worker_problems(beats: list[dict[str, Any]], stale_s: float) -> tuple[int, list[str]]:
    """(ready workers, reasons the others are not) from heartbeat JSON."""
    now, ready, reasons = time.time(), 0, []
    for beat in beats:
        worker = beat.get("worker_id", "?")
        age = now - float(beat.get("ts", 0))
        if age > stale_s:
            reasons.append(f"worker {worker}: heartbeat {age:.1f}s old")
        elif beat.get("stopping"):
            reasons.append(f"worker {worker}: shutting down")
        elif not beat.get("healthy"):
            reasons.append(f"worker {worker}: unhealthy ({beat.get('last_error') or 'no reason given'})")
        elif beat.get("model_loaded") is False or not beat.get("model"):
            reasons.append(f"worker {worker}: model not loaded")
        else:
            ready += 1
    return ready, reasons


@router.get("/readyz")
async def readyz(state: StateDep) -> JSONResponse:
    try:
        await asyncio.wait_for(state.redis.ping(), REDIS_CHECK_S)
        stale_s = state.settings.worker_stale_s
        beats = await asyncio.wait_for(read_heartbeats(state.redis, state.keys, stale_s), REDIS_CHECK_S)
    except (redis.exceptions.RedisError, TimeoutError, OSError) as exc:
        return JSONResponse(
            {"status": "unavailable", "reasons": [f"redis unreachable: {exc}"]}, status_code=503
        )
    ready, reasons = worker_problems(beats, state.settings.worker_stale_s)
    if ready == 0:
        reasons.append("no inference worker with a fresh heartbeat, a loaded model and healthy")
        return JSONResponse(
            {"status": "unavailable", "workers_ready": 0, "reasons": reasons}, status_code=503
        )
    return JSONResponse({"status": "ready", "workers_ready": ready, "reasons": reasons})


@router.get("/metrics")
async def metrics(state: StateDep, _tenant: TenantDep) -> Response:
    """On the API port a key is needed; ``VLMQ_METRICS_PORT`` serves the same without one."""
    return await render_metrics(state)


async def render_metrics(state: GatewayState) -> Response:
    body = await state.metrics.render(state.redis, state.keys)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
