"""OpenAI-compatible API: ``POST /v1/chat/completions`` (stream or not), ``GET /v1/models``.

The client going away before the end cancels the job (abort on disconnect). A job that did not
end ``done`` answers by its ``error_code`` (``TERMINAL_HTTP``): the client's fault is a 4xx (the
official client retries 5xx, resubmitting), 500 only for internal errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse

from gateway.accept import Accepted, cache_headers, submit
from gateway.auth import TenantDep
from gateway.deps import NoCacheDep, StateDep
from gateway.errors import APIError, error_body
from gateway.event_reader import is_terminal
from gateway.intake import from_openai
from gateway.job_records import ANY_TENANT, cancel_job, load_record
from gateway.listeners import job_events
from gateway.openai_schema import (
    ChatCompletionRequest,
    chunk_json,
    completion_json,
    completion_json_of,
    terminal_error,
    usage_json,
)
from gateway.request_params import ID_PATTERN
from gateway.routes.job_streams import SHUTDOWN_GRACE_S
from gateway.state import GatewayState
from gateway.stream_slots import SlotEventSourceResponse, StreamSlot
from shared.schemas import JobEvent, JobStatus

router = APIRouter(prefix="/v1", tags=["openai"])


@router.get("/models")
async def list_models(state: StateDep, _tenant: TenantDep) -> dict[str, Any]:
    return {"object": "list", "data": [_model_card(state.settings.model_name)]}


@router.get("/models/{model_id:path}")  # names like org/model
async def get_model(model_id: str, state: StateDep, _tenant: TenantDep) -> dict[str, Any]:
    """The official clients' ``models.retrieve``."""
    name = state.settings.model_name
    if model_id != name:
        raise APIError(
            404,
            f"model {model_id!r} not found; this server serves {name!r}",
            param="model",
            code="model_not_found",
        )
    return _model_card(name)


def _model_card(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "vlmq"}


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
        left, terminal = await _wait(request, state, accepted)
    if left:  # job_events already cancelled it
        return JSONResponse(error_body(499, "client closed the request"), status_code=499)
    if terminal is None:
        # No terminal event: the job is gone (404 from the read) or this gateway is shutting down.
        return await _answer_without_end(state, accepted.spec.job_id, headers)
    status = _status_of(terminal)
    if status != JobStatus.DONE:
        http, message, code = terminal_error(status, terminal.error_code, terminal.error)
        raise APIError(http, message, code=code)
    spec, model = accepted.spec, state.settings.model_name
    body_json = completion_json(
        spec.job_id, model, spec.created_at, terminal.final_text, terminal.finish_reason, terminal.usage
    )
    return JSONResponse(body_json, headers=headers)


def _status_of(terminal: JobEvent) -> JobStatus:
    """The job's final status, as ``FINISH_LUA`` wrote it with this event."""
    if terminal.type == "done":
        return JobStatus.DONE
    return terminal.status or JobStatus.FAILED


async def _answer_without_end(state: GatewayState, job_id: str, headers: dict[str, str]) -> JSONResponse:
    """The job's stream ended with no terminal event: answer from its record."""
    record = await load_record(state, job_id, ANY_TENANT)
    if not record.status.terminal:  # this gateway is shutting down
        with contextlib.suppress(APIError):  # nobody will read this answer: free the batch slot
            await cancel_job(state, job_id, ANY_TENANT)
        raise APIError(
            503,
            "gateway shutting down; retry the request",
            code="shutting_down",
            headers={"Retry-After": "1"},
        )
    if record.status != JobStatus.DONE:
        status, message, code = terminal_error(record.status, record.error_code, record.error)
        raise APIError(status, message, code=code)
    model = state.settings.model_name
    return JSONResponse(completion_json_of(job_id, model, record), headers=headers)


async def _wait(request: Request, state: GatewayState, accepted: Accepted) -> tuple[bool, JobEvent | None]:
    """(whether the client left first, the job's terminal event if its stream had one).

    The terminal event holds all the answer needs (``FINISH_LUA`` writes the record's result
    fields from it): no read of the record after it. A client that leaves cancels the job."""
    job_id, after = accepted.spec.job_id, accepted.queued_event_id  # status events: not waited for
    terminal: list[JobEvent] = []

    async def until_terminal() -> None:
        async for _, event in job_events(
            state, job_id, after, "openai", cancel_on_disconnect=True, fresh=True
        ):
            if is_terminal(event):
                terminal.append(event)

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
        return True, None
    waiting.result()
    return False, terminal[0] if terminal else None


async def _chunks(state: GatewayState, accepted: Accepted, include_usage: bool) -> AsyncIterator[str]:
    job_id, model = accepted.spec.job_id, state.settings.model_name
    created = int(accepted.spec.created_at)

    def chunk(delta: dict[str, Any], finish: str | None = None, usage: dict[str, Any] | None = None) -> str:
        return json.dumps(chunk_json(job_id, model, created, delta, finish, usage, choices=usage is None))

    yield chunk({"role": "assistant", "content": ""})
    streamed = ended = False
    after = accepted.queued_event_id  # its status events are not shown: start after the first
    async for _, event in job_events(state, job_id, after, "openai", cancel_on_disconnect=True, fresh=True):
        if event.type == "token" and event.text:
            streamed = True
            yield chunk({"content": event.text})
        elif event.type == "done":
            ended = True
            if not streamed and event.final_text:  # result-cache hit: no token events
                yield chunk({"content": event.final_text})
            yield chunk({}, event.finish_reason or "stop")
            if include_usage:
                yield chunk({}, usage=usage_json(event.usage))
        elif is_terminal(event):
            ended = True
            http, message, code = terminal_error(
                event.status or JobStatus.FAILED, event.error_code, event.error
            )
            yield json.dumps(error_body(http, message, code=code))
    if not ended:  # this gateway is shutting down: say so rather than end as if complete
        with contextlib.suppress(APIError):
            await cancel_job(state, job_id, ANY_TENANT)
        yield json.dumps(error_body(503, "gateway shutting down; retry the request", code="shutting_down"))
    yield "[DONE]"
