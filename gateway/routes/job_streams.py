"""Resumable event streams of one job: SSE (``/events``) and WebSocket (``/stream``).

Resume with the last event id seen: SSE ``Last-Event-ID`` header (browsers send it on
reconnect) or ``?last_event_id=``; WebSocket ``?last_event_id=``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Header, Query, WebSocket
from sse_starlette import EventSourceResponse

from gateway.auth import TenantDep, accept_websocket, tenant_name
from gateway.deps import StateDep
from gateway.errors import APIError, error_body, upgrade_required
from gateway.event_reader import check_event_id
from gateway.job_records import current_record
from gateway.listeners import event_payload, job_events, until_disconnect, ws_open, ws_send_events
from gateway.request_params import check_job_id
from gateway.shutdown import server_exiting
from gateway.state import GatewayState
from gateway.stream_slots import SlotEventSourceResponse

router = APIRouter(prefix="/v1/jobs", tags=["streams"])

PING_S = 15
# On SIGTERM our reader notices within one XREAD block (1 s) and ends the response cleanly;
# sse-starlette cancels it only after this grace period.
SHUTDOWN_GRACE_S = 2.5


async def _sse(state: GatewayState, job_id: str, last_id: str, cancel: bool) -> AsyncIterator[dict[str, Any]]:
    async for event_id, event in job_events(state, job_id, last_id, "sse", cancel):
        yield {"id": event_id, "event": event.type, "data": json.dumps(event_payload(event_id, event))}


@router.get("/{job_id}/events")
async def job_events_sse(
    job_id: str,
    state: StateDep,
    tenant: TenantDep,
    last_event_id: Annotated[str | None, Query()] = None,
    last_event_id_header: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
) -> EventSourceResponse:
    last_id = check_event_id(last_event_id_header or last_event_id)
    record = await current_record(state, check_job_id(job_id), tenant_name(tenant))
    slot = state.stream_slots.take()
    stream = _sse(state, job_id, last_id, record.spec.cancel_on_disconnect)
    return SlotEventSourceResponse(
        stream,
        slot=slot,
        ping=PING_S,
        headers={"Cache-Control": "no-store"},
        shutdown_event=anyio.Event(),
        shutdown_grace_period=SHUTDOWN_GRACE_S,
    )


@router.get("/{job_id}/stream", include_in_schema=False)
async def stream_over_http(job_id: str) -> None:
    raise upgrade_required("/v1/jobs/{id}/stream")


@router.websocket("/{job_id}/stream")
async def job_events_ws(
    websocket: WebSocket, job_id: str, state: StateDep, last_event_id: Annotated[str | None, Query()] = None
) -> None:
    accepted, tenant = await accept_websocket(websocket)
    if not accepted:
        return
    try:
        last_id = check_event_id(last_event_id)
        record = await current_record(state, check_job_id(job_id), tenant_name(tenant))
        slot = state.stream_slots.take()
    except APIError as exc:
        body = error_body(exc.status_code, exc.message, exc.param, exc.code)
        await websocket.send_json({"type": "error", **body})
        await websocket.close(code=4000 + exc.status_code, reason=exc.message[:120])
        return
    events = job_events(state, job_id, last_id, "ws", record.spec.cancel_on_disconnect)
    watcher = asyncio.create_task(until_disconnect(websocket))
    try:
        if await ws_send_events(websocket, events, watcher) and ws_open(websocket):
            # 1012 (service restart) tells the client to reconnect with its last id.
            await websocket.close(code=1012 if server_exiting() else 1000)
    finally:
        slot.release()
        watcher.cancel()
