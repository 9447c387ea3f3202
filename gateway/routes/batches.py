"""OpenAI's Batch API: ``/v1/files`` (JSONL input, output and error files) and ``/v1/batches``.

Compatible with the official client's ``files.create(purpose="batch")``, ``batches.create``,
``batches.retrieve``, ``batches.list``, ``batches.cancel`` and ``files.content``. A tenant sees
only its own files and batches.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from starlette.datastructures import UploadFile

from gateway.auth import TenantDep, tenant_name
from gateway.batch_files import (
    check_batch_lines,
    delete_file,
    file_content,
    list_files,
    load_file,
    store_file,
)
from gateway.batches import cancel_batch, create_batch, list_batches, load_batch
from gateway.deps import StateDep
from gateway.errors import APIError
from gateway.intake import parse_json_object

router = APIRouter(prefix="/v1", tags=["batch"])


@router.post("/files")
async def upload_file(request: Request, state: StateDep, tenant: TenantDep) -> dict[str, Any]:
    form = await request.form(max_files=1, max_fields=4)
    try:
        upload, purpose = form.get("file"), form.get("purpose")
        if purpose != "batch":
            raise APIError(400, "purpose: only 'batch' files are accepted", param="purpose")
        if not isinstance(upload, UploadFile):
            raise APIError(400, "file: a JSONL file is required", param="file")
        data = await upload.read()
        lines = check_batch_lines(data)
        return await store_file(
            state, tenant_name(tenant), "batch", upload.filename or "input.jsonl", lines, len(data)
        )
    finally:
        await form.close()


@router.get("/files")
async def get_files(
    state: StateDep,
    tenant: TenantDep,
    purpose: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    after: Annotated[str | None, Query(max_length=200)] = None,
) -> dict[str, Any]:
    data, more = await list_files(state, tenant_name(tenant), purpose, limit, after)
    return page(data, more)


@router.delete("/files/{file_id}")
async def remove_file(file_id: str, state: StateDep, tenant: TenantDep) -> dict[str, Any]:
    await delete_file(state, file_id, tenant_name(tenant))
    return {"id": file_id, "object": "file", "deleted": True}


@router.get("/files/{file_id}")
async def get_file(file_id: str, state: StateDep, tenant: TenantDep) -> dict[str, Any]:
    return await load_file(state, file_id, tenant_name(tenant))


@router.get("/files/{file_id}/content")
async def get_file_content(file_id: str, state: StateDep, tenant: TenantDep) -> Response:
    content = await file_content(state, file_id, tenant_name(tenant))
    return Response(content, media_type="application/jsonl")


@router.post("/batches")
async def new_batch(request: Request, state: StateDep, tenant: TenantDep) -> dict[str, Any]:
    body = parse_json_object(await request.body(), "body")
    return await create_batch(state, tenant_name(tenant), body)


@router.get("/batches/{batch_id}")
async def get_batch(batch_id: str, state: StateDep, tenant: TenantDep) -> dict[str, Any]:
    return await load_batch(state, batch_id, tenant_name(tenant))


@router.get("/batches")
async def get_batches(
    state: StateDep,
    tenant: TenantDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: Annotated[str | None, Query(max_length=200)] = None,
) -> dict[str, Any]:
    data, more = await list_batches(state, tenant_name(tenant), limit, after)
    return page(data, more)


def page(data: list[dict[str, Any]], more: bool) -> dict[str, Any]:
    """OpenAI's cursor page (the official client follows ``has_more`` with ``after=last_id``)."""
    first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
    return {"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": more}


@router.post("/batches/{batch_id}/cancel")
async def cancel(batch_id: str, state: StateDep, tenant: TenantDep) -> dict[str, Any]:
    return await cancel_batch(state, batch_id, tenant_name(tenant))
