"""Refused submissions: right status, a message that says what is wrong, nothing stored."""

from __future__ import annotations

import base64
import io
import struct
import zlib
from typing import Any

import httpx
import pytest
from PIL import Image

from gateway.body_limit import body_limit
from tests.gateway.conftest import MAX_IMAGE_BYTES, stored_keys
from tests.support.jobs import image_bytes
from tests.support.stack import ServiceStack

JPEG = image_bytes("JPEG", (160, 120))


def png_header(width: int, height: int) -> bytes:
    """A PNG whose IHDR declares ``width`` x ``height`` (a decompression bomb header)."""

    def chunk(kind: bytes, payload: bytes) -> bytes:
        body = kind + payload
        return struct.pack(">I", len(payload)) + body + struct.pack(">I", zlib.crc32(body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 1024)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def gif() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (10, 10)).save(buf, format="GIF")
    return buf.getvalue()


def noisy_png(size: int) -> bytes:
    """A valid PNG larger than ``size`` bytes (random pixels do not compress)."""
    import os

    side = int((size / 3) ** 0.5) + 16
    img = Image.frombytes("RGB", (side, side), os.urandom(side * side * 3))
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=0)
    return buf.getvalue()


async def assert_refused(gateway: ServiceStack, request: Any, status: int, words: str) -> dict[str, Any]:
    before = stored_keys(gateway)
    resp: httpx.Response = await request
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert words.lower() in error["message"].lower(), error
    assert error["type"]
    assert stored_keys(gateway) == before, "a refused request left keys behind"
    return error


def multipart(client: httpx.AsyncClient, data: bytes | None, **fields: object) -> Any:
    files = {"image": ("x.png", data, "application/octet-stream")} if data is not None else None
    form = {k: str(v) for k, v in fields.items()}
    if files is None:
        return client.post("/v1/jobs", data=form)
    return client.post("/v1/jobs", data=form, files=files)


@pytest.mark.parametrize(
    ("data", "status", "words"),
    [
        (b"just some text, not an image", 415, "unsupported"),
        (b"%PDF-1.4 renamed to .png", 415, "accepted: JPEG, PNG, WebP"),
        (gif(), 415, "unsupported"),
        (b"", 400, "empty"),
        (b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, 400, "corrupt"),
        (b"\xff\xd8\xff\xe0garbage", 400, "corrupt"),
        (png_header(50_000, 50_000), 413, "pixel"),
        (png_header(3000, 3000), 413, "pixel"),
    ],
    ids=["text", "pdf", "gif", "empty", "bad-png", "bad-jpeg", "bomb", "too-many-pixels"],
)
async def test_bad_images(
    client: httpx.AsyncClient, gateway: ServiceStack, data: bytes, status: int, words: str
) -> None:
    error = await assert_refused(gateway, multipart(client, data, prompt="What is it?"), status, words)
    assert error["param"] == "image"


async def test_image_too_large(client: httpx.AsyncClient, gateway: ServiceStack) -> None:
    big = noisy_png(MAX_IMAGE_BYTES + 1000)
    await assert_refused(gateway, multipart(client, big, prompt="Big?"), 413, "limit")
    b64 = base64.b64encode(big).decode()
    await assert_refused(gateway, client.post("/v1/jobs", json={"image": b64, "prompt": "x"}), 413, "larger")


async def test_body_too_large_declared_and_chunked(client: httpx.AsyncClient, gateway: ServiceStack) -> None:
    limit = body_limit(MAX_IMAGE_BYTES, gateway.settings.max_images_per_request)  # every image at its cap
    huge = b"x" * (limit + 1000)
    await assert_refused(gateway, multipart(client, huge, prompt="x"), 413, "too large")

    async def chunks():  # type: ignore[no-untyped-def]
        for _ in range(limit // 10_000 + 2):
            yield b"y" * 10_000

    headers = {"content-type": "application/json"}
    await assert_refused(
        gateway, client.post("/v1/jobs", content=chunks(), headers=headers), 413, "too large"
    )


@pytest.mark.parametrize(
    ("body", "status", "words", "param"),
    [
        ({"image": "not base64 at all!!", "prompt": "x"}, 400, "base64", "image"),
        ({"image": "data:image/png,rawdata", "prompt": "x"}, 400, "base64", "image"),
        ({"image": "https://example.com/cat.jpg", "prompt": "x"}, 400, "not fetched", "image"),
        ({"image": 12, "prompt": "x"}, 400, "base64", "image"),
        ({"image": "IMG"}, 422, "prompt", "prompt"),
        ({"image": "IMG", "prompt": "   "}, 422, "blank", "prompt"),
        ({"image": "IMG", "prompt": "x" * 2001}, 422, "longer than", "prompt"),
        ({"image": "IMG", "prompt": "x", "temperature": -1}, 422, "temperature", "temperature"),
        ({"image": "IMG", "prompt": "x", "max_tokens": 0}, 422, "max_tokens", "max_tokens"),
        ({"image": "IMG", "prompt": "x", "max_tokens": 100000}, 422, "at most", "max_tokens"),
        ({"image": "IMG", "prompt": "x", "top_p": 0}, 422, "top_p", "top_p"),
        ({"image": "IMG", "prompt": "x", "min_tokens": -1}, 422, "min_tokens", "min_tokens"),
        (
            {"image": "IMG", "prompt": "x", "max_tokens": 8, "min_tokens": 9},
            422,
            "at most max_tokens (8)",
            "min_tokens",
        ),
        ({"image": "IMG", "prompt": "x", "min_tokens": 65}, 422, "at most max_tokens (64)", "min_tokens"),
        ({"image": "IMG", "prompt": "x", "ignore_eos": "sometimes"}, 422, "ignore_eos", "ignore_eos"),
        ({"image": "IMG", "prompt": "x", "timeout_s": -5}, 422, "timeout_s", "timeout_s"),
        ({"image": "IMG", "prompt": "x", "session_id": "bad id!"}, 422, "session_id", "session_id"),
        ({"image": "IMG", "prompt": "x", "promt": "typo"}, 422, "promt", "promt"),
        ({"prompt": "unknown session", "session_id": "nope-123"}, 404, "not found or expired", "session_id"),
    ],
)
async def test_bad_json_fields(
    client: httpx.AsyncClient,
    gateway: ServiceStack,
    body: dict[str, Any],
    status: int,
    words: str,
    param: str,
) -> None:
    if body.get("image") == "IMG":
        body = {**body, "image": base64.b64encode(JPEG).decode()}
    error = await assert_refused(gateway, client.post("/v1/jobs", json=body), status, words)
    assert error["param"] == param


async def test_bad_form_field(client: httpx.AsyncClient, gateway: ServiceStack) -> None:
    error = await assert_refused(
        gateway, multipart(client, JPEG, prompt="x", max_tokens="many"), 422, "max_tokens"
    )
    assert error["param"] == "max_tokens"


async def test_not_json_and_wrong_content_type(client: httpx.AsyncClient, gateway: ServiceStack) -> None:
    headers = {"content-type": "application/json"}
    await assert_refused(gateway, client.post("/v1/jobs", content=b"{nope", headers=headers), 400, "JSON")
    await assert_refused(gateway, client.post("/v1/jobs", content=b"[1]", headers=headers), 400, "object")
    headers = {"content-type": "text/plain"}
    await assert_refused(
        gateway, client.post("/v1/jobs", content=b"hi", headers=headers), 415, "content type"
    )


async def test_session_system_prompt_is_fixed(client: httpx.AsyncClient, gateway: ServiceStack) -> None:
    files = {"image": ("a.jpg", JPEG, "image/jpeg")}
    first = await client.post("/v1/jobs", data={"prompt": "Hi", "system": "Be brief."}, files=files)
    sid = first.json()["session_id"]
    body = {"prompt": "More", "session_id": sid, "system": "Be verbose."}
    await assert_refused(gateway, client.post("/v1/jobs", json=body), 400, "system prompt is fixed")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/v1/chat/completions",
            '{"model": "MODEL", "messages": [{"role": "user", "content": "hi \\ud800"}]}',
        ),
        (
            "/v1/chat/completions",
            '{"model": "MODEL", "messages": [{"role": "user", "content": "hi"}], "stop": ["\\udfff"]}',
        ),
        ("/v1/jobs", '{"prompt": "What colour?", "system": "be \\udfff brief"}'),
    ],
    ids=["chat-content", "chat-stop", "jobs-system"],
)
async def test_lone_surrogates_are_refused_and_hold_no_queue_place(
    client: httpx.AsyncClient, gateway: ServiceStack, path: str, body: str
) -> None:
    """JSON may escape half a UTF-16 pair; Python decodes it into a str no UTF-8 writer accepts.
    Refused as the client's 400 before admission: repeated, such requests never fill the queue."""
    headers = {"content-type": "application/json"}
    content = body.replace("MODEL", gateway.settings.model_name).encode()
    active = gateway.keys.active_jobs()
    places_before = gateway.redis.zcard(active)  # other tests' jobs may hold places
    for _ in range(3):
        request = client.post(path, content=content, headers=headers)
        error = await assert_refused(gateway, request, 400, "not valid Unicode")
        assert error["code"] == "invalid_unicode"
    assert gateway.redis.zcard(active) == places_before
