"""Image checks the gateway can afford: size, magic bytes, a bounded structure walk, Pillow header.
No pixel decode.

The decode worker does the full (safe) decode; here a request is refused before anything is
stored when it is too big, not an allowed format, malformed or too costly to parse
(``shared.formats.check_structure``: marker/chunk floods, truncation), or its header is unreadable.

Payloads over ``INLINE_LIMIT`` (sha256 and structure walk of up to 10 MB, the multipart file read)
are processed on one dedicated thread (``PAYLOAD_THREAD``), smaller ones inline: the hop to the
thread and back costs ~0.18 CPU-ms (measured: ``inspect_image`` of a 1024 px JPEG, 196 KB, 0.22 ms
inline, 0.40 through the thread), about what checking a 256 KB image inline costs. base64 is decoded
inline by pybase64's SIMD pass (~0.05 ms a MB); text it refuses (line-wrapped, stray padding) goes
through the standard library, ~5 ms a MB, on the thread past ``WRAPPED_INLINE_LIMIT``. One thread,
not anyio's pool of 40: glibc gives each thread that allocates its own malloc arena, and once a
freed multi-megabyte buffer has raised glibc's dynamic mmap threshold, every arena keeps up to
twice that size (~25 MB) of freed memory it never returns; spread over the pool's threads that
was ~200 MB of RSS held for good after a burst of large uploads (bench: ``tests/gateway/test_memory.py``).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import io
import re
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import pybase64
from PIL import Image, JpegImagePlugin
from starlette.datastructures import UploadFile

from gateway.errors import APIError
from shared.config import GatewaySettings
from shared.formats import ALLOWED_TEXT as ALLOWED
from shared.formats import StructureError, check_structure, name_format, sniff_format

INLINE_LIMIT = 256 * 1024  # bytes of payload checked on the event loop
WRAPPED_INLINE_LIMIT = 64 * 1024  # base64 text the standard library decodes on the event loop
PAYLOAD_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vlmq-payload")
T = TypeVar("T")
_DATA_URL = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^,;]*)*?);base64,", re.I)
_URL_SCHEME = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*)://")


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
    text = _base64_text(value, max_bytes, field)
    data = _fast_base64(text)
    return data if data is not None else _slow_base64(text, field)


async def decode_base64_image_async(value: str, max_bytes: int, field: str = "image") -> bytes:
    text = _base64_text(value, max_bytes, field)
    data = _fast_base64(text)  # inline at any size: a SIMD pass
    if data is not None:
        return data
    return await on_payload_thread(len(text), _slow_base64, text, field, inline_limit=WRAPPED_INLINE_LIMIT)


def _base64_text(value: str, max_bytes: int, field: str) -> str:
    """The base64 part of ``value`` (a ``data:`` URL's payload), refused when it is a remote URL or
    decodes to more than ``max_bytes``."""
    text = value.strip()
    if scheme := _URL_SCHEME.match(text):  # base64 holds no ':', so this is a URL
        kind = "remote image" if scheme[1].lower() in ("http", "https") else f"'{scheme[1]}:' image"
        raise APIError(400, f"{field}: {kind} URLs are not fetched; send a data: URL or base64", param=field)
    if text.startswith("data:"):
        match = _DATA_URL.match(text)
        if match is None:
            raise APIError(
                400, f"{field}: data URL must be base64-encoded (data:<type>;base64,...)", param=field
            )
        text = text[match.end() :]
    if _decoded_size_over(text, max_bytes):
        raise APIError(
            413, f"{field}: image larger than {max_bytes} bytes", param=field, code="image_too_large"
        )
    return text


def _decoded_size_over(text: str, max_bytes: int) -> bool:
    """Whether the decoded bytes would exceed ``max_bytes``; whitespace (only dropped, never
    decoded) is counted out only when the length alone is over, so the usual case copies nothing."""
    limit = max_bytes + 3
    return len(text) * 3 // 4 > limit and len("".join(text.split())) * 3 // 4 > limit


def _fast_base64(text: str) -> bytes | None:
    """pybase64's SIMD decode (0.01 ms for a 1024 px JPEG, against the standard library's 0.8: its
    validation is a regex), or None where it refuses. It accepts nothing the standard library
    refuses, but refuses line-wrapped text and stray padding after whole quads, which
    ``_slow_base64`` then decides."""
    try:
        return pybase64.b64decode(text, validate=True)
    except ValueError:  # binascii.Error and non-ASCII text
        return None


def _slow_base64(text: str, field: str) -> bytes:
    """``base64.b64decode(validate=True)`` after dropping whitespace (line-wrapped base64 is common)."""
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise APIError(400, f"{field}: not valid base64", param=field, code="bad_base64") from None


async def on_payload_thread(
    size: int, fn: Callable[..., T], *args: object, inline_limit: int = INLINE_LIMIT
) -> T:
    """``fn(*args)`` inline for a small payload, else on the payload thread (event loop stays free)."""
    if size <= inline_limit:
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(PAYLOAD_THREAD, fn, *args)


async def read_upload(upload: UploadFile) -> bytes:
    """A multipart file's bytes (spooled to disk past 1 MB), read on the payload thread."""
    return await on_payload_thread(upload.size or 0, upload.file.read)


async def inspect_image_async(
    data: bytes, max_bytes: int, max_pixels: int, field: str = "image"
) -> ImageInfo:
    return await on_payload_thread(len(data), inspect_image, data, max_bytes, max_pixels, field)


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
    fmt = _allowed_format(data, field)
    _check_structure(data, fmt, field)
    width, height = _header_size(data, fmt, max_pixels, field)
    if width * height > max_pixels:
        raise APIError(
            413,
            f"{field}: {width}x{height} pixels exceeds the {max_pixels}-pixel limit",
            param=field,
            code="image_too_many_pixels",
        )
    return ImageInfo(hashlib.sha256(data).hexdigest(), fmt, width, height, len(data))


def _allowed_format(data: bytes, field: str) -> str:
    fmt = sniff_format(data)
    if fmt is None:
        other = name_format(data)
        what = f"unsupported image type {other}" if other else "unsupported or unrecognised image type"
        raise APIError(
            415, f"{field}: {what}; accepted: {ALLOWED}", param=field, code="unsupported_image_type"
        )
    return fmt


def _check_structure(data: bytes, fmt: str, field: str) -> None:
    """Bounded walk first: Pillow's own header parse is then cheap (no marker or chunk floods)."""
    try:
        structure = check_structure(data, fmt)
    except StructureError as exc:
        what = "refused" if exc.problem == "too_complex" else "corrupt or truncated"
        raise APIError(400, f"{field}: {what}: {exc}", param=field, code="bad_image") from None
    if structure.animated:
        raise APIError(
            415,
            f"{field}: animated images are not supported; send one frame ({ALLOWED})",
            param=field,
            code="unsupported_image_type",
        )


def _header_size(data: bytes, fmt: str, max_pixels: int, field: str) -> tuple[int, int]:
    """Open lazily (header only) with Pillow, restricted to the sniffed format."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with _open_header(data, fmt) as im:
                width, height = im.size
    except Image.DecompressionBombError:
        raise APIError(
            413,
            f"{field}: declared dimensions exceed the {max_pixels}-pixel limit",
            param=field,
            code="image_too_many_pixels",
        ) from None
    except Exception:  # any header Pillow cannot parse (fuzzed files raise more than OSError)
        raise APIError(
            400, f"{field}: corrupt or truncated {fmt} header", param=field, code="corrupt_image"
        ) from None
    if width <= 0 or height <= 0:
        raise APIError(
            400, f"{field}: image has no pixels ({width}x{height})", param=field, code="corrupt_image"
        )
    return width, height


def _open_header(data: bytes, fmt: str) -> Image.Image:
    # A JPEG's first frame is the image: opened as a plain JPEG, an MPO is not a multi-frame file.
    if fmt == "JPEG":
        return JpegImagePlugin.JpegImageFile(io.BytesIO(data))
    return Image.open(io.BytesIO(data), formats=[fmt])
