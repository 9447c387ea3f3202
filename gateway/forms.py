"""Reading a ``POST /v1/jobs`` body: multipart (file in ``image``) or JSON (base64 image)."""

from __future__ import annotations

import json
from typing import Any

from starlette.datastructures import UploadFile
from starlette.requests import Request

from gateway.errors import APIError
from gateway.images import decode_base64_image_async
from gateway.params import JobParams, parse_params
from shared.config import GatewaySettings

MAX_FORM_FIELDS = 32


async def read_submission(request: Request, settings: GatewaySettings) -> tuple[JobParams, bytes | None]:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "multipart/form-data":
        raw, image = await _read_multipart(request, settings)
    elif content_type in ("application/json", ""):
        raw = await _read_json(request)
        image = raw.pop("image", None)
        if image is not None and not isinstance(image, str):
            raise APIError(400, "image: expected a base64 string or a data: URL", param="image")
        image = await decode_base64_image_async(image, settings.max_image_bytes) if image else None
    else:
        raise APIError(
            415,
            f"unsupported content type {content_type!r}; send multipart/form-data or application/json",
            code="unsupported_content_type",
        )
    return parse_params(raw), image


async def _read_multipart(request: Request, settings: GatewaySettings) -> tuple[dict[str, Any], bytes | None]:
    form = await request.form(max_files=1, max_fields=MAX_FORM_FIELDS)
    raw: dict[str, Any] = {}
    image: bytes | None = None
    for name in form:
        values = form.getlist(name)
        if name == "image":
            image = await _form_image(values[0], settings)
        elif name == "stop":
            raw["stop"] = [str(v) for v in values]
        else:
            if len(values) > 1 or isinstance(values[0], UploadFile):
                raise APIError(400, f"{name}: expected one text value", param=name)
            raw[name] = values[0]
    return raw, image


async def _form_image(value: Any, settings: GatewaySettings) -> bytes | None:
    if isinstance(value, UploadFile):
        return await value.read()
    return await decode_base64_image_async(str(value), settings.max_image_bytes) if value else None


async def _read_json(request: Request) -> dict[str, Any]:
    body = await request.body()
    try:
        raw = json.loads(body or b"{}")
    except (ValueError, UnicodeDecodeError):
        raise APIError(400, "body is not valid JSON", code="bad_json") from None
    if not isinstance(raw, dict):
        raise APIError(400, "body must be a JSON object", code="bad_json")
    return raw
