"""OpenAI-compatible API: ``POST /v1/chat/completions`` (stream or not), ``GET /v1/models``.

The client going away before the end cancels the job (abort on disconnect). A job that did not
end ``done`` answers by its ``error_code`` (``TERMINAL_HTTP``): the client's fault is a 4xx (the
official client retries 5xx, resubmitting), 500 only for internal errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterable
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse, ServerSentEvent

from gateway.accept import Accepted, cache_headers, submit
from gateway.auth import TenantDep
from gateway.deps import NoCacheDep, StateDep
from gateway.errors import APIError, error_body
from gateway.event_reader import is_terminal
from gateway.intake import from_openai
from gateway.job_records import ANY_TENANT, cancel_job, load_record
from gateway.listeners import job_event_batches, job_events
from gateway.openai_schema import (
    ChatCompletionRequest,
    chunk_json,
    completion_json,
    terminal_error,
    usage_json,
)
from gateway.request_params import ID_PATTERN
from gateway.routes.job_streams import SHUTDOWN_GRACE_S
from gateway.state import GatewayState
from gateway.stream_slots import SlotEventSourceResponse, StreamSlot
from shared.jobs import JobRecord
from shared.schemas import JobEvent, JobStatus

router = APIRouter(prefix="/v1", tags=["openai"])


@router.get("/models")
async def list_models(state: StateDep, _tenant: TenantDep) -> dict[str, Any]:
    name = state.settings.model_name
    return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "vlmq"}]}


@router.post("/chat/completions", response_model=None)
async def chat_completions(
    body: ChatCompletionRequest,
    request: Request,
    state: StateDep,
    tenant: TenantDep,
    no_cache: NoCacheDep,
    x_session_id: Annotated[str | None, Header(pattern=ID_PATTERN)] = None,
) -> JSONResponse | EventSourceResponse:
    slot = state.stream_slots.take()  # even a non-streaming answer waits on the job's event stream
    try:
        submission = await from_openai(body, state.settings, x_session_id, no_cache)
        accepted = await submit(state, submission.by(tenant))
        request.state.job_id = accepted.spec.job_id  # for the audit log
        return await _answer(body, request, state, accepted, no_cache, slot)
    except BaseException:
        slot.release()
        raise


async def _answer(
    body: ChatCompletionRequest,
    request: Request,
    state: GatewayState,
    accepted: Accepted,
    no_cache: bool,
    slot: StreamSlot,
) -> JSONResponse | EventSourceResponse:
    """The streamed answer (the response releases the slot when it ends) or the whole one."""
    headers = {
        "X-VLMQ-Job-Id": accepted.spec.job_id,
        "X-Session-Id": accepted.spec.affinity_key or "",
        **cache_headers(accepted, no_cache, state.settings.result_cache_ttl_s),
    }
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return SlotEventSourceResponse(
            _chunks(state, accepted, include_usage),
            slot=slot,
            headers=headers,
            ping=15,
            shutdown_event=anyio.Event(),
            shutdown_grace_period=SHUTDOWN_GRACE_S,
        )
    with slot:
        record = await _wait(request, state, accepted)
    if record is None:  # client left: job_events already cancelled it
        return JSONResponse(error_body(499, "client closed the request"), status_code=499)
    if not record.status.terminal:  # the stream ended early: this gateway is shutting down
        with contextlib.suppress(APIError):  # nobody will read this answer: free the batch slot
            await cancel_job(state, accepted.spec.job_id, ANY_TENANT)
        raise APIError(
            503,
            "gateway shutting down; retry the request",
            code="shutting_down",
            headers={"Retry-After": "1"},
        )
    if record.status != JobStatus.DONE:
        status, message, code = terminal_error(record.status, record.error_code, record.error)
        raise APIError(status, message, code=code)
    return JSONResponse(
        completion_json(accepted.spec.job_id, state.settings.model_name, record), headers=headers
    )


async def _wait(request: Request, state: GatewayState, accepted: Accepted) -> JobRecord | None:
    """The finished record, or None when the client disconnects first (then the job is cancelled)."""
    job_id, after = accepted.spec.job_id, accepted.queued_event_id  # status events: not waited for

    async def until_terminal() -> None:
        async for _ in job_events(state, job_id, after, "openai", cancel_on_disconnect=True, fresh=True):
            pass

    async def until_disconnect() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    waiting, leaving = asyncio.create_task(until_terminal()), asyncio.create_task(until_disconnect())
    try:
        done, _ = await asyncio.wait({waiting, leaving}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (waiting, leaving):
            task.cancel()
        await asyncio.gather(waiting, leaving, return_exceptions=True)
    if waiting not in done:
        return None
    waiting.result()
    return await load_record(state, job_id, ANY_TENANT)


async def _chunks(state: GatewayState, accepted: Accepted, include_usage: bool) -> AsyncIterator[bytes]:
    """The stream's SSE events, encoded: the role chunk at once (the client sees the stream live
    while the job waits), then what each read of the job's events returned in one write (a step's
    token with the job's end, usage and ``[DONE]``): each write is a send on the socket, on the
    gateway's CPU and the client's."""
    job_id, after = accepted.spec.job_id, accepted.queued_event_id  # its status events: not shown
    chunks = _Chunks(job_id, state.settings.model_name, int(accepted.spec.created_at), include_usage)
    yield sse_bytes([chunks.chunk({"role": "assistant", "content": ""})])
    batches = job_event_batches(state, job_id, after, "openai", cancel_on_disconnect=True, fresh=True)
    async for batch in batches:
        datas = chunks.of(event for _, event in batch)
        if chunks.ended:
            datas.append("[DONE]")
        if datas:  # a read of status events only shows nothing
            yield sse_bytes(datas)
    if not chunks.ended:  # this gateway is shutting down: say so rather than end as if complete
        with contextlib.suppress(APIError):
            await cancel_job(state, job_id, ANY_TENANT)
        message = error_body(503, "gateway shutting down; retry the request", code="shutting_down")
        yield sse_bytes([json.dumps(message), "[DONE]"])


class _Chunks:
    """One streamed completion's chunks, event by event."""

    def __init__(self, job_id: str, model: str, created: int, include_usage: bool) -> None:
        self.job_id, self.model, self.created, self.include_usage = job_id, model, created, include_usage
        self.streamed = self.ended = False

    def chunk(
        self, delta: dict[str, Any], finish: str | None = None, usage: dict[str, Any] | None = None
    ) -> str:
        body = chunk_json(self.job_id, self.model, self.created, delta, finish, usage, choices=usage is None)
        return json.dumps(body)

    def of(self, events: Iterable[JobEvent]) -> list[str]:
        out: list[str] = []
        for event in events:
            if event.type == "token" and event.text:
                self.streamed = True
                out.append(self.chunk({"content": event.text}))
            elif event.type == "done":
                self.ended = True
                if not self.streamed and event.final_text:  # result-cache hit: no token events
                    out.append(self.chunk({"content": event.final_text}))
                out.append(self.chunk({}, event.finish_reason or "stop"))
                if self.include_usage:
                    out.append(self.chunk({}, usage=usage_json(event.usage)))
            elif is_terminal(event):
                self.ended = True
                http, message, code = terminal_error(
                    event.status or JobStatus.FAILED, event.error_code, event.error
                )
                out.append(json.dumps(error_body(http, message, code=code)))
        return out


def sse_bytes(datas: list[str]) -> bytes:
    """Several SSE ``data:`` events as one body part, each as sse-starlette encodes it alone."""
    sep = EventSourceResponse.DEFAULT_SEPARATOR
    return b"".join(ServerSentEvent(data, sep=sep).encode() for data in datas)
