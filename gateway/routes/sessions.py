"""``/v1/sessions/{id}``: a conversation's turns and image digest; delete to forget it."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from gateway.deps import StateDep
from gateway.errors import APIError
from gateway.sessions import delete_session, load_session

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])


def _not_found(session_id: str) -> APIError:
    return APIError(
        404, f"session {session_id!r} not found (unknown or expired)", param="id", code="session_not_found"
    )


@router.get("/{session_id}")
async def get_session(session_id: str, state: StateDep) -> dict[str, Any]:
    session = await load_session(state.redis, state.keys, session_id)
    if session is None:
        raise _not_found(session_id)
    return {"object": "session", **session.to_json()}


@router.delete("/{session_id}", status_code=204)
async def remove_session(session_id: str, state: StateDep) -> Response:
    if not await delete_session(state.redis, state.keys, session_id):
        raise _not_found(session_id)
    return Response(status_code=204)
