"""Image checks the gateway can afford: size, magic bytes, Pillow header. No pixel decode.

The decode worker does the full (safe) decode; here a request is refused before anything
is stored when it is too big, not an allowed format, or its header is unreadable.

The ``*_async`` variants keep the event loop free: payloads over ``INLINE_LIMIT`` (sha256 of up to
10 MB, base64 of up to 13 MB) are processed on a worker thread; small ones inline.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import re
import warnings
from dataclasses import dataclass

import anyio
from PIL import Image, UnidentifiedImageError

from gateway.errors import APIError
from shared.config import GatewaySettings
from shared.formats import ALLOWED_TEXT as ALLOWED
from shared.formats import sniff_format

INLINE_LIMIT = 64 * 1024  # bytes of payload handled on the event loop
_DATA_URL = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^,;]*)*?);base64,", re.I)


@dataclass(frozen=True)
class ImageInfo:
    digest: str  # full sha256 hex of the bytes (never truncated: collisions give wrong answers)
    format: str  # JPEG | PNG | WEBP
    width: int
    height: int
    size: int


@dataclass(frozen=True)
class CheckedImage:
    """An upload that passed every gateway check: its bytes and what its header says."""

    data: bytes
    info: ImageInfo


async def read_image(value: bytes | str, settings: GatewaySettings, field: str = "image") -> CheckedImage:
    """Raw bytes, base64 or a ``data:`` URL -> checked image (4xx with ``field`` named otherwise)."""
    limit = settings.max_image_bytes
    data = await decode_base64_image_async(value, limit, field) if isinstance(value, str) else value
    info = await inspect_image_async(data, limit, settings.max_image_pixels, field)
    return CheckedImage(data, info)


def decode_base64_image(value: str, max_bytes: int, field: str = "image") -> bytes:
    """base64 text or a ``data:`` URL -> bytes; refuses remote URLs and oversized payloads."""
    text = value.strip()
    if text.startswith(("http://", "https://")):
        raise APIError(
            400, f"{field}: remote image URLs are not fetched; send a data: URL or base64", param=field
        )
    if text.startswith("data:"):
        match = _DATA_URL.match(text)
        if match is None:
            raise APIError(
                400, f"{field}: data URL must be base64-encoded (data:<type>;base64,...)", param=field
            )
        text = text[match.end() :]
    text = "".join(text.split())
    if len(text) * 3 // 4 > max_bytes + 3:
        raise APIError(
            413, f"{field}: image larger than {max_bytes} bytes", param=field, code="image_too_large"
        )
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise APIError(400, f"{field}: not valid base64", param=field, code="bad_base64") from None
    return data


async def decode_base64_image_async(value: str, max_bytes: int, field: str = "image") -> bytes:
    if len(value) <= INLINE_LIMIT:
        return decode_base64_image(value, max_bytes, field)
    return await anyio.to_thread.run_sync(decode_base64_image, value, max_bytes, field)


async def inspect_image_async(
    data: bytes, max_bytes: int, max_pixels: int, field: str = "image"
) -> ImageInfo:
    if len(data) <= INLINE_LIMIT:
        return inspect_image(data, max_bytes, max_pixels, field)
    return await anyio.to_thread.run_sync(inspect_image, data, max_bytes, max_pixels, field)


def inspect_image(data: bytes, max_bytes: int, max_pixels: int, field: str = "image") -> ImageInfo:
    if not data:
        raise APIError(400, f"{field}: empty file", param=field, code="empty_image")
    if len(data) > max_bytes:
        raise APIError(
            413,
            f"{field}: {len(data)} bytes exceeds the {max_bytes}-byte limit",
            param=field,
            code="image_too_large",
        )
    fmt = sniff_format(data)
    if fmt is None:
        raise APIError(
            415,
            f"{field}: unsupported or unrecognised image type; accepted: {ALLOWED}",
            param=field,
            code="unsupported_image_type",
        )
    width, height = _header_size(data, fmt, max_pixels, field)
    if width * height > max_pixels:
        raise APIError(
            413,
            f"{field}: {width}x{height} pixels exceeds the {max_pixels}-pixel limit",
            param=field,
            code="image_too_many_pixels",
        )
    return ImageInfo(hashlib.sha256(data).hexdigest(), fmt, width, height, len(data))


def _header_size(data: bytes, fmt: str, max_pixels: int, field: str) -> tuple[int, int]:
    """Open lazily (header only) with Pillow, restricted to the sniffed format."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=[fmt]) as im:
                width, height = im.size
    except Image.DecompressionBombError:
        raise APIError(
            413,
            f"{field}: declared dimensions exceed the {max_pixels}-pixel limit",
            param=field,
            code="image_too_many_pixels",
        ) from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError):
        raise APIError(
            400, f"{field}: corrupt or truncated {fmt} header", param=field, code="corrupt_image"
        ) from None
    if width <= 0 or height <= 0:
        raise APIError(
            400, f"{field}: image has no pixels ({width}x{height})", param=field, code="corrupt_image"
        )
    return width, height
