"""Pushing a job's events to a client (SSE and WebSocket share this).

A stream stops at the terminal event or when the client leaves. A job submitted with
``cancel_on_disconnect`` is cancelled when its last listener on this gateway leaves before
the end (listeners are counted per process: one gateway per deployment for now).
Readers use the stream pool (``state.streams``); routes take a slot
(``state.stream_slots.take()``) before starting a stream, so a full pool answers 503 instead of
blocking.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from gateway.errors import APIError
from gateway.event_reader import follow
from gateway.job_records import ANY_TENANT, cancel_job, current_record
from gateway.shutdown import server_exiting
from gateway.state import GatewayState
from shared.schemas import JobEvent

log = logging.getLogger(__name__)
_listeners: Counter[str] = Counter()


def event_payload(event_id: str, event: JobEvent) -> dict[str, Any]:
    return {"id": event_id, **event.model_dump(mode="json", exclude_none=True)}


async def job_events(
    state: GatewayState,
    job_id: str,
    last_id: str,
    kind: str,
    cancel_on_disconnect: bool = False,
    fresh: bool = False,
) -> AsyncIterator[tuple[str, JobEvent]]:
    """``follow`` plus listener bookkeeping, lazy expiry and the cancel-on-disconnect rule.

    ``fresh``: the job was accepted by this very request (its deadline ahead, its record and
    stream just written), so the reader blocks for its events at once: no expiry check nor
    non-blocking first read, three round trips a job that a resumed stream needs and it does not."""
    _listeners[job_id] += 1
    state.metrics.open_streams.labels(kind).inc()
    finished = False

    async def expire_check() -> None:
        with contextlib.suppress(APIError):  # gone: follow() notices and ends
            await current_record(state, job_id, ANY_TENANT)  # the route checked the tenant

    try:
        if not fresh:
            await expire_check()
        events = follow(state.streams, state.keys, job_id, last_id, on_idle=expire_check, block_first=fresh)
        async for item in events:
            yield item
        finished = True
    finally:
        state.metrics.open_streams.labels(kind).dec()
        _listeners[job_id] -= 1
        if _listeners[job_id] <= 0:
            del _listeners[job_id]
            # A gateway shutting down is not a client leaving: the client resumes elsewhere.
            if cancel_on_disconnect and not finished and not server_exiting():
                await _cancel_quietly(state, job_id)


async def _cancel_quietly(state: GatewayState, job_id: str) -> None:
    # Runs while the request is being torn down: shield it so the flag is always written.
    with contextlib.suppress(Exception):
        await asyncio.shield(cancel_job(state, job_id, ANY_TENANT))
        log.info("job %s cancelled: its last listener left", job_id)


async def ws_send_events(
    ws: WebSocket, events: AsyncIterator[tuple[str, JobEvent]], watcher: asyncio.Task[Any]
) -> bool:
    """Send events until the terminal one (True), or until ``watcher`` ends first (False):
    the watcher is the task reading the client's messages, which ends when it leaves."""

    async def pump() -> None:
        async for event_id, event in events:
            await ws.send_json(event_payload(event_id, event))

    pump_task = asyncio.create_task(pump())
    try:
        await asyncio.wait({pump_task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not pump_task.done():
            pump_task.cancel()
        await asyncio.gather(pump_task, return_exceptions=True)
        await events.aclose()  # type: ignore[attr-defined]
    if pump_task.cancelled():
        return False
    error = pump_task.exception()
    if error is None:
        return True
    if isinstance(error, WebSocketDisconnect | RuntimeError | OSError):
        return False  # the client left while we were sending
    raise error


async def until_disconnect(ws: WebSocket) -> None:
    """Reads (and drops) client messages until the client leaves."""
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                return


def ws_open(ws: WebSocket) -> bool:
    return ws.client_state == WebSocketState.CONNECTED and ws.application_state == WebSocketState.CONNECTED
