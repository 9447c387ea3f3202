"""FastAPI dependencies, as ``Annotated`` aliases (full-stack-fastapi-template style).

All ``async``: FastAPI runs a plain ``def`` dependency in its thread pool, a thread hand-off per
request (and per dependency) for what takes microseconds here."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header
from starlette.requests import HTTPConnection

from gateway.state import GatewayState
from shared.config import GatewaySettings


async def get_state(conn: HTTPConnection) -> GatewayState:
    state: GatewayState = conn.app.state.gateway
    return state


async def get_settings(state: Annotated[GatewayState, Depends(get_state)]) -> GatewaySettings:
    return state.settings


async def wants_no_cache(
    cache_control: Annotated[str | None, Header()] = None, pragma: Annotated[str | None, Header()] = None
) -> bool:
    """``Cache-Control: no-cache`` (or no-store, or max-age=0) on the request bypasses the result
    cache; so does HTTP/1.0's ``Pragma: no-cache`` where no Cache-Control is sent (RFC 9111 5.4)."""
    if cache_control is None:
        return (pragma or "").strip().lower() == "no-cache"
    directives = {d.strip().lower().replace(" ", "") for d in cache_control.split(",")}
    return bool(directives & {"no-cache", "no-store", "max-age=0"})


StateDep = Annotated[GatewayState, Depends(get_state)]
SettingsDep = Annotated[GatewaySettings, Depends(get_settings)]
NoCacheDep = Annotated[bool, Depends(wants_no_cache)]
