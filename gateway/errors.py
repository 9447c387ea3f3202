"""One error shape for every route: OpenAI's ``{"error": {message, type, param, code}}``.

``APIError`` subclasses Starlette's ``HTTPException`` so FastAPI lets it through unchanged
even when it is raised while the body is being read (body-size limit).
"""

from __future__ import annotations

import logging
from typing import Any

import redis.exceptions
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

log = logging.getLogger(__name__)

_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    499: "cancelled_error",
    503: "service_unavailable_error",
}


class APIError(HTTPException):
    """A client-facing error: status, clear message, optional offending parameter."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(status_code=status_code, detail=message, headers=headers)
        self.message = message
        self.param = param
        self.code = code


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def validation_message(errors: list[Any]) -> tuple[str, str | None]:
    """Pydantic errors -> one readable line and the first offending field."""
    parts, first = [], None
    for err in errors:
        loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path", "header")]
        field = ".".join(loc) or None
        first = first or field
        parts.append(f"{field}: {err.get('msg')}" if field else str(err.get("msg")))
    return "; ".join(parts) or "invalid request", first


FASTAPI_BODY_ERROR = "There was an error parsing the body"  # FastAPI's 400 when json.loads raises oddly


def json_error_message(error: dict[str, Any]) -> str:
    """FastAPI's ``json_invalid`` error (its ``loc``: ("body", character offset)) as one line."""
    where = [p for p in error.get("loc", ()) if isinstance(p, int)]
    reason = (error.get("ctx") or {}).get("error", "JSON decode error")
    at = f" at character {where[0]}" if where else ""
    return f"body is not valid JSON: {reason}{at}"


def _count(request: Request, status: int) -> None:
    """``vlmq_gateway_requests_rejected{status}`` (absent before the lifespan has run)."""
    state = getattr(request.app.state, "gateway", None)
    if state is not None:
        state.metrics.rejected.labels(str(status)).inc()


def install_error_handlers(app: FastAPI) -> None:
    async def on_client_gone(request: Request, exc: Exception) -> Response:
        # The body never arrived whole (the client left, or sent broken chunked framing, which
        # the server answered itself): the client's doing, 499 in the audit log, no traceback.
        _count(request, 499)
        return Response(status_code=499)

    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, APIError)
        _count(request, exc.status_code)
        body = error_body(exc.status_code, exc.message, exc.param, exc.code)
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if isinstance(exc.__cause__, ClientDisconnect):  # FastAPI's body reader wraps it in a 400
            return await on_client_gone(request, exc.__cause__)
        _count(request, exc.status_code)
        body = error_body(exc.status_code, str(exc.detail))
        if exc.status_code == 400 and exc.detail == FASTAPI_BODY_ERROR:  # its reader gave up on the JSON
            deep = isinstance(exc.__cause__, RecursionError)
            body = error_body(
                400, "body is nested too deeply" if deep else "body could not be read", code="bad_json"
            )
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = list(exc.errors())
        if bad_json := next((e for e in errors if e.get("type") == "json_invalid"), None):
            _count(request, 400)  # as the jobs route says it: the body, not a field, is wrong
            return JSONResponse(
                error_body(400, json_error_message(bad_json), code="bad_json"), status_code=400
            )
        _count(request, 422)
        message, param = validation_message(errors)
        return JSONResponse(error_body(422, message, param), status_code=422)

    async def on_redis_down(request: Request, exc: Exception) -> JSONResponse:
        # Fail fast and say why: clients retry, jobs already accepted stay in Redis.
        log.warning("redis unavailable: %s", exc)
        _count(request, 503)
        body = error_body(503, "job store unavailable, retry shortly", code="redis_unavailable")
        return JSONResponse(body, status_code=503, headers={"Retry-After": "1"})

    app.add_exception_handler(ClientDisconnect, on_client_gone)
    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(HTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(redis.exceptions.ConnectionError, on_redis_down)
    app.add_exception_handler(redis.exceptions.TimeoutError, on_redis_down)


def upgrade_required(path: str) -> APIError:
    """A plain HTTP request to a WebSocket route (426, RFC 9110 15.5.22)."""
    return APIError(
        426,
        f"{path} is a WebSocket endpoint; connect with a WebSocket client (Upgrade: websocket)",
        code="upgrade_required",
        headers={"Upgrade": "websocket", "Connection": "Upgrade"},
    )
