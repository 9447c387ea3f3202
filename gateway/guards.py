"""What every request passes through before a route: Host and Origin checks, security headers, the
audit log. Pure ASGI middleware (no body buffering: streams stay streams).

- **Host**: only the names in ``VLMQ_ALLOWED_HOSTS`` (``*``: any); links the gateway builds
  (``status_url``) copy it. Probes (``/healthz``, ``/readyz``) are exempt: Kubernetes sends the
  pod IP.
- **Origin**: a browser's WebSocket and state-changing requests (POST, PUT, PATCH, DELETE) must
  come from the page's own origin or one in ``VLMQ_CORS_ORIGINS``; a request without ``Origin``
  (curl, SDKs, the CLI) passes. Else 403 (a WebSocket is refused before it opens).
- **Headers** on every response: a strict Content-Security-Policy (the page's script and styles
  are files), ``X-Frame-Options: DENY``, ``X-Content-Type-Options: nosniff``, no referrer.
- **Audit**: one line per request on the ``vlmq.audit`` logger: client address, tenant, method,
  route, status, job id. Never the key, the image or the prompt. It is the gateway's access log
  (``python -m gateway`` turns uvicorn's own off: two lines a request said the same).
"""

from __future__ import annotations

import json
import logging
from collections.abc import MutableMapping
from typing import Any
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import error_body

audit = logging.getLogger("vlmq.audit")
PROBES = frozenset({"/healthz", "/readyz"})
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self' ws: wss:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
SECURITY_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
]


class Guard:
    def __init__(self, app: ASGIApp, allowed_hosts: str, cors_origins: str) -> None:
        self.app = app
        self.hosts = {h.strip().lower() for h in allowed_hosts.split(",") if h.strip()}
        self.origins = {o.strip().rstrip("/").lower() for o in cors_origins.split(",") if o.strip()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            await _refuse(scope, send, *refusal)
            return
        status: list[int] = []
        try:
            await self.app(scope, receive, _watching(send, scope, status))
        finally:  # a request that raised is audited too (as the 500 it became)
            if scope["type"] == "http":
                _audit(scope, status[0] if status else 500)

    def _refusal(self, scope: Scope, headers: dict[str, str]) -> tuple[int, str] | None:
        host = headers.get("host", "")
        if scope["path"] not in PROBES and "*" not in self.hosts and _hostname(host) not in self.hosts:
            return 400, f"Host {host!r} not allowed (VLMQ_ALLOWED_HOSTS)"
        origin = headers.get("origin")
        checked = scope["type"] == "websocket" or scope.get("method") in STATE_CHANGING
        if origin and checked and not self._origin_allowed(origin, host):
            return 403, f"Origin {origin!r} not allowed (VLMQ_CORS_ORIGINS)"
        return None

    def _origin_allowed(self, origin: str, host: str) -> bool:
        origin = origin.rstrip("/").lower()
        return urlsplit(origin).netloc == host.lower() or origin in self.origins


def _hostname(host: str) -> str:
    """The Host header without its port ('[::1]:8000' -> '[::1]')."""
    host = host.strip().lower()
    if host.startswith("["):
        return host.split("]", 1)[0] + "]"
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _watching(send: Send, scope: Scope, status: list[int]) -> Send:
    """``send`` that adds the security headers and notes the response status."""

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])
            extra = [*SECURITY_HEADERS]
            if not scope["path"].startswith("/docs"):  # Swagger UI loads its own script
                extra.append((b"content-security-policy", CSP.encode()))
            message["headers"] = [*message.get("headers", []), *extra]
        await send(message)

    return wrapped


async def _refuse(scope: Scope, send: Send, status: int, message: str) -> None:
    if scope["type"] == "websocket":  # closing before accepting is a 403 to the client
        await send({"type": "websocket.close", "code": 1008, "reason": message[:120]})
        return
    body = json.dumps(error_body(status, message, code="forbidden_origin_or_host")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": [*headers, *SECURITY_HEADERS]})
    await send({"type": "http.response.body", "body": body})
    _audit(scope, status)


def _audit(scope: Scope, status: int) -> None:
    state: MutableMapping[str, Any] = scope.get("state") or {}
    params: dict[str, Any] = scope.get("path_params") or {}
    job = params.get("job_id") or state.get("job_id") or "-"
    route = getattr(scope.get("route"), "path", scope["path"])
    client = scope.get("client") or ("-", 0)
    audit.info(
        "client=%s tenant=%s method=%s route=%s status=%d job=%s",
        client[0],
        state.get("tenant", "-"),
        scope.get("method", "WS"),
        route,
        status,
        job,
    )
