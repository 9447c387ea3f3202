"""``/v1/jobs``: submit, poll, cancel."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from gateway.accept import Accepted, cache_headers, submit
from gateway.auth import TenantDep, tenant_name
from gateway.deps import NoCacheDep, StateDep
from gateway.intake import from_http
from gateway.job_records import cancel_job, job_view
from gateway.request_params import check_job_id

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


def job_urls(request: Request, job_id: str) -> dict[str, str]:
    base = str(request.base_url).rstrip("/")
    ws_base = "ws" + base.removeprefix("http")  # http->ws, https->wss
    return {
        "status_url": f"{base}/v1/jobs/{job_id}",
        "events_url": f"{base}/v1/jobs/{job_id}/events",
        "stream_url": f"{ws_base}/v1/jobs/{job_id}/stream",
    }


def accepted_body(request: Request, accepted: Accepted) -> dict[str, Any]:
    spec = accepted.spec
    body: dict[str, Any] = {
        "id": spec.job_id,
        "object": "job",
        "status": accepted.status.value,
        "session_id": spec.conversation_id,
        **job_urls(request, spec.job_id),
        "result_cached": accepted.cached is not None,
    }
    if accepted.cached is not None:
        body.update(
            text=accepted.cached.text,
            finish_reason=accepted.cached.finish_reason,
            usage=accepted.cached.usage.model_dump(),
        )
    return body


@router.post("", status_code=202)
async def submit_job(
    request: Request, state: StateDep, tenant: TenantDep, no_cache: NoCacheDep
) -> JSONResponse:
    """Multipart (file in ``image``) or JSON (``image`` as base64 / data URL) -> 202 + URLs."""
    submission = (await from_http(request, state.settings, no_cache)).by(tenant)
    accepted = await submit(state, submission)
    request.state.job_id = accepted.spec.job_id  # for the audit log
    body = accepted_body(request, accepted)
    headers = {
        **cache_headers(accepted, no_cache, state.settings.result_cache_ttl_s),
        "Location": body["status_url"],
    }
    return JSONResponse(body, status_code=202, headers=headers)


@router.get("/{job_id}")
async def get_job(job_id: str, state: StateDep, tenant: TenantDep) -> dict[str, Any]:
    return await job_view(state, check_job_id(job_id), tenant_name(tenant))


@router.delete("/{job_id}")
async def delete_job(job_id: str, state: StateDep, tenant: TenantDep) -> JSONResponse:
    """Cancel: 200 when the job is now cancelled, 202 when the running job was asked to stop
    (it ends as cancelled at its next decode step), 409 when it had already finished."""
    status, _ = await cancel_job(state, check_job_id(job_id), tenant_name(tenant))
    code = 202 if not status.terminal else 200
    return JSONResponse(
        {"id": job_id, "object": "job", "status": status.value, "cancel_requested": True}, status_code=code
    )
