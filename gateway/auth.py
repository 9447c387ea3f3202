"""Who is asking: the API key of a request or a WebSocket, and the tenant it names.

HTTP: ``Authorization: Bearer KEY`` (what the ``openai`` client sends). Browsers cannot set
headers on a WebSocket, so they offer the subprotocols ``vlmq.v1`` and ``vlmq.bearer.KEY``
(as Kubernetes does for its tokens); the server answers with ``vlmq.v1``, never echoing the key.
A missing or wrong key: 401 in OpenAI's error shape (WebSocket: close 1008), counted in
``vlmq_gateway_auth_failures_total``; nothing is read or stored. With no key configured the
gateway is open (development only) and every request's tenant is None.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, WebSocket
from starlette.requests import HTTPConnection

from gateway.errors import APIError
from gateway.guards import audit
from gateway.keyring import Tenant
from gateway.state import GatewayState

WS_PROTOCOL = "vlmq.v1"
WS_KEY_PREFIX = "vlmq.bearer."
POLICY_VIOLATION = 1008


def presented_key(conn: HTTPConnection) -> str | None:
    scheme, _, value = conn.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    for protocol in _subprotocols(conn):
        if protocol.startswith(WS_KEY_PREFIX):
            return protocol.removeprefix(WS_KEY_PREFIX)
    return None


def _subprotocols(conn: HTTPConnection) -> list[str]:
    raw = conn.headers.get("sec-websocket-protocol", "")
    return [p.strip() for p in raw.split(",") if p.strip()]


async def authenticate(conn: HTTPConnection) -> Tenant | None:
    """The dependency: ``async`` because FastAPI runs a plain ``def`` dependency in its thread pool,
    a thread hand-off per request for microseconds of work."""
    return tenant_of(conn)


def tenant_of(conn: HTTPConnection) -> Tenant | None:
    """The request's tenant (None: an open gateway); raises 401 for a missing or wrong key."""
    state: GatewayState = conn.app.state.gateway
    if not state.keyring.enabled:
        return None
    tenant = state.keyring.tenant(presented_key(conn))
    if tenant is None:
        state.metrics.auth_failures.labels(conn.scope["type"]).inc()
        missing = presented_key(conn) is None
        message = "missing API key: send Authorization: Bearer <key>" if missing else "invalid API key"
        raise APIError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
    conn.state.tenant = tenant.name  # for the audit log
    return tenant


async def require_admin(tenant: Annotated[Tenant | None, Depends(authenticate)]) -> Tenant | None:
    if tenant is not None and not tenant.admin:
        raise APIError(403, "this key may not use operator routes", code="not_admin")
    return tenant


async def accept_websocket(websocket: WebSocket) -> tuple[bool, Tenant | None]:
    """Accept (answering ``vlmq.v1`` when offered) and authenticate; (False, None) once closed 1008."""
    chosen = WS_PROTOCOL if WS_PROTOCOL in _subprotocols(websocket) else None
    await websocket.accept(subprotocol=chosen)
    try:
        tenant = tenant_of(websocket)
    except APIError as exc:
        audit.info("tenant=- method=WS route=%s status=1008 job=-", websocket.url.path)
        await websocket.send_json({"type": "error", "status": 401, "error": exc.message, "code": exc.code})
        await websocket.close(code=POLICY_VIOLATION, reason=exc.message[:120])
        return False, None
    audit.info(
        "tenant=%s method=WS route=%s status=101 job=-", tenant_name(tenant) or "-", websocket.url.path
    )
    return True, tenant


def tenant_name(tenant: Tenant | None) -> str | None:
    return tenant.name if tenant else None


TenantDep = Annotated[Tenant | None, Depends(authenticate)]
AdminDep = Annotated[Tenant | None, Depends(require_admin)]
