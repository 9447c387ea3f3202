"""``/v1/dead-letters``: jobs failed for good after too many deliveries; list them, retry one."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse

from gateway.auth import AdminDep
from gateway.dead_letters import list_dead_letters, retry_dead_letter
from gateway.deps import StateDep
from gateway.routes.jobs import accepted_body

router = APIRouter(prefix="/v1/dead-letters", tags=["operations"])


@router.get("")
async def dead_letters(
    state: StateDep, _admin: AdminDep, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> dict[str, Any]:
    return {"object": "list", "data": await list_dead_letters(state, limit)}


@router.post("/{job_id}/retry", status_code=202)
async def retry(job_id: str, request: Request, state: StateDep, _admin: AdminDep) -> JSONResponse:
    """202 with the new job (its own id); 404 unknown, 409 not failed, 410 image expired, 429 full."""
    accepted = await retry_dead_letter(state, job_id)
    return JSONResponse({**accepted_body(request, accepted), "retry_of": job_id}, status_code=202)
