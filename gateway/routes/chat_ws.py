"""``WS /v1/chat/ws``: submit and stream in one connection, turn after turn (the web page uses
``POST /v1/jobs`` and ``/v1/jobs/{id}/stream`` instead, for HTTP's status codes on uploads).

Client -> server: a job as JSON (``prompt``, ``image`` as a data URL or omitted within a
session, ``session_id``, sampling params, ``no_cache: true`` to bypass the result cache),
or ``{"type": "cancel"}`` to stop the job that is streaming (a job may say ``"type": "job"``;
any other type is an error event). Jobs sent while one streams
wait their turn (in order), up to ``MAX_PENDING``; past that a submission is refused with an
error event (the reader never blocks, so a ``cancel`` is always read at once).
Server -> client: ``{"type": "accepted", "id", "session_id"}``, then the job's events
(``status``/``token``/``done``/``error``, each with ``id``), then the next job's.
A refused submission answers ``{"type": "error", "status", "error", "param"}`` and the
connection stays open.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketDisconnect

from gateway.accept import submit
from gateway.auth import accept_websocket
from gateway.deps import StateDep
from gateway.errors import APIError, upgrade_required
from gateway.intake import from_ws_message, parse_json_object
from gateway.job_records import ANY_TENANT, cancel_job
from gateway.keyring import Tenant
from gateway.listeners import job_events, ws_send_events
from gateway.state import GatewayState

router = APIRouter(tags=["chat"])
MAX_PENDING = 16  # submissions queued behind the streaming one


def _error(exc: APIError) -> dict[str, Any]:
    return {
        "type": "error",
        "status": exc.status_code,
        "error": exc.message,
        "param": exc.param,
        "code": exc.code,
    }


class _Connection:
    """Reads client messages for the whole connection: cancels act at once, jobs queue up."""

    def __init__(self, websocket: WebSocket, state: GatewayState, tenant: Tenant | None) -> None:
        self.tenant = tenant
        self.ws, self.state = websocket, state
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue(MAX_PENDING)
        self.current: str | None = None

    async def read(self) -> None:
        with contextlib.suppress(WebSocketDisconnect, RuntimeError):
            while (frame := await self.ws.receive())["type"] != "websocket.disconnect":
                try:
                    message = _parse(frame)
                except APIError as exc:  # the connection stays open: the next frame may be fine
                    await self.ws.send_json(_error(exc))
                    continue
                kind = message.get("type")
                if kind == "cancel":
                    await self.cancel_current()
                elif kind in (None, "job"):
                    await self.enqueue(message)
                else:
                    await self.ws.send_json(_error(_unknown_type(kind)))

    async def enqueue(self, message: dict[str, Any]) -> None:
        try:
            self.inbox.put_nowait(message)
        except asyncio.QueueFull:
            error = (
                f"too many pending submissions on this connection (max {MAX_PENDING}); wait for one to end"
            )
            await self.ws.send_json(
                {"type": "error", "status": 429, "error": error, "code": "too_many_pending"}
            )

    async def cancel_current(self) -> None:
        if self.current is not None:
            with contextlib.suppress(APIError):  # already finished: nothing to cancel
                await cancel_job(self.state, self.current, ANY_TENANT)  # its own job

    async def next_job(self, reader: asyncio.Task[None]) -> dict[str, Any] | None:
        """The next submission, or None once the client has left."""
        getter = asyncio.create_task(self.inbox.get())
        done, _ = await asyncio.wait({getter, reader}, return_when=asyncio.FIRST_COMPLETED)
        if getter in done:
            return getter.result()
        getter.cancel()
        return None


def _parse(frame: Mapping[str, Any]) -> dict[str, Any]:
    """A client frame -> a JSON object, else APIError (binary, not JSON, nested too deeply, not an object)."""
    text = frame.get("text")
    if text is None:
        raise APIError(
            400, "binary frames are not accepted: send each message as JSON text", code="bad_frame"
        )
    return parse_json_object(text, "message")


def _unknown_type(kind: Any) -> APIError:
    shown = ascii(kind)[:80]
    message = f'type: unknown message type {shown}; send a job (no type, or "job") or {{"type": "cancel"}}'
    return APIError(400, message, param="type", code="unknown_message_type")


@router.get("/v1/chat/ws", include_in_schema=False)
async def chat_over_http() -> None:
    raise upgrade_required("/v1/chat/ws")


@router.websocket("/v1/chat/ws")
async def chat_ws(websocket: WebSocket, state: StateDep) -> None:
    accepted, tenant = await accept_websocket(websocket)
    if not accepted:
        return
    conn = _Connection(websocket, state, tenant)
    reader = asyncio.create_task(conn.read())
    try:
        while (message := await conn.next_job(reader)) is not None:
            try:
                slot = state.stream_slots.take()
            except APIError as exc:
                await websocket.send_json(_error(exc))
                continue
            with slot:
                finished = await _submit_and_stream(websocket, state, conn, message, reader)
            if not finished:
                return
    except (WebSocketDisconnect, RuntimeError):
        return
    finally:
        reader.cancel()


async def _submit_and_stream(
    websocket: WebSocket,
    state: GatewayState,
    conn: _Connection,
    message: dict[str, Any],
    reader: asyncio.Task[None],
) -> bool:
    """One job of the connection: accepted (or refused) and streamed. False once the client left."""
    try:
        accepted = await submit(state, (await from_ws_message(message, state.settings)).by(conn.tenant))
    except APIError as exc:
        await websocket.send_json(_error(exc))
        return True
    spec = accepted.spec
    conn.current = spec.job_id
    await websocket.send_json(
        {
            "type": "accepted",
            "id": spec.job_id,
            "session_id": spec.conversation_id,
            "status": accepted.status.value,
            "result_cached": accepted.cached is not None,
        }
    )
    events = job_events(state, spec.job_id, "0", "chat_ws", spec.cancel_on_disconnect, fresh=True)
    finished = await ws_send_events(websocket, events, reader)
    conn.current = None
    return finished
