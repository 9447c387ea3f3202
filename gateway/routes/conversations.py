"""``/v1/sessions/{id}``: a stored conversation's turns and image digest; delete to forget it."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from gateway.auth import TenantDep, tenant_name
from gateway.conversations import delete_conversation, load_conversation
from gateway.deps import StateDep
from gateway.errors import APIError
from gateway.request_params import shown, valid_conversation_id

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])


def _not_found(session_id: str) -> APIError:
    return APIError(
        404,
        f"session {shown(session_id)} not found (unknown or expired)",
        param="id",
        code="session_not_found",
    )


def _checked(session_id: str) -> str:
    """An id no conversation can have (``session_id``'s pattern) is a 404 without asking Redis."""
    if not valid_conversation_id(session_id):
        raise _not_found(session_id)
    return session_id


@router.get("/{session_id}")
async def get_session(session_id: str, state: StateDep, tenant: TenantDep) -> dict[str, Any]:
    owner = tenant_name(tenant)  # a tenant sees its own conversations only
    conversation = await load_conversation(state.redis, state.keys, _checked(session_id), owner)
    if conversation is None:
        raise _not_found(session_id)
    return {"object": "session", **conversation.to_json()}


@router.delete("/{session_id}", status_code=204)
async def remove_session(session_id: str, state: StateDep, tenant: TenantDep) -> Response:
    if not await delete_conversation(state.redis, state.keys, _checked(session_id), tenant_name(tenant)):
        raise _not_found(session_id)
    return Response(status_code=204)
