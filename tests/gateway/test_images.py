"""Large payloads are hashed and decoded off the event loop, small ones inline; base64 as strict as
the standard library's."""

from __future__ import annotations

import asyncio
import base64
import io
import os
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from PIL import Image

from gateway.errors import APIError
from gateway.image_checks import (
    INLINE_LIMIT,
    WRAPPED_INLINE_LIMIT,
    decode_base64_image,
    decode_base64_image_async,
    inspect_image_async,
)


def noise_png(side: int) -> bytes:
    buf = io.BytesIO()
    Image.frombytes("RGB", (side, side), os.urandom(side * side * 3)).save(
        buf, format="PNG", compress_level=0
    )
    return buf.getvalue()


async def loop_turns_during(call: Callable[[], Awaitable[Any]]) -> tuple[Any, int]:
    """Run ``call``; how often the event loop ran something else meanwhile."""
    turns, done = 0, asyncio.Event()

    async def ticker() -> None:
        nonlocal turns
        while not done.is_set():
            turns += 1
            await asyncio.sleep(0)

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    turns = 0
    result = await call()
    done.set()
    await tick
    return result, turns


async def test_large_payloads_leave_the_event_loop_free() -> None:
    """Checking a big picture and the standard library's decode of wrapped base64 run on the payload
    thread; pybase64's decode of plain base64 (a SIMD pass) runs inline at any size."""
    big = noise_png(700)
    assert len(big) > INLINE_LIMIT
    info, turns = await loop_turns_during(lambda: inspect_image_async(big, 10**8, 10**8))
    assert info.width == 700 and turns > 0
    wrapped = base64.encodebytes(big).decode()
    assert len(wrapped) > WRAPPED_INLINE_LIMIT
    data, turns = await loop_turns_during(lambda: decode_base64_image_async(wrapped, 10**8))
    assert data == big and turns > 0
    data, turns = await loop_turns_during(
        lambda: decode_base64_image_async(base64.b64encode(big).decode(), 10**8)
    )
    assert data == big and turns <= 1


async def test_small_payloads_are_handled_inline() -> None:
    small = noise_png(16)
    assert len(small) < INLINE_LIMIT
    info, turns = await loop_turns_during(lambda: inspect_image_async(small, 10**8, 10**8))
    assert info.width == 16 and turns <= 1


def _stdlib_reference(text: str) -> bytes | None:
    """What the gateway accepted before pybase64: whitespace dropped, then a strict decode."""
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except ValueError:
        return None


def _ours(text: str) -> bytes | None:
    try:
        return decode_base64_image(text, 10**8)
    except APIError as exc:
        assert exc.status_code == 400 and exc.code == "bad_base64"
        return None


def test_base64_is_as_strict_as_the_standard_library() -> None:
    """Line-wrapped text decodes; bad alphabet, padding or non-ASCII is refused, as before."""
    rng = random.Random(7)
    data = os.urandom(300)
    cases = [base64.b64encode(data).decode(), base64.encodebytes(data).decode(), " QUJD\r\nRA== \t"]
    cases += ["QUJDRA==QQ==", "QUJD*A==", "QUJDRA=", "QUJDR", "====", "QUJDéA==", "", "QUJD\x00RA=="]
    alphabet = "ABCDab+/=\n -_é*"
    for _ in range(400):
        chars = list(base64.b64encode(os.urandom(rng.randint(0, 12))).decode())
        for _ in range(rng.randint(0, 3)):
            chars.insert(rng.randint(0, len(chars)), rng.choice(alphabet))
        cases.append("".join(chars))
    for text in cases:
        assert _ours(text) == _stdlib_reference(text), repr(text)
    assert _ours(cases[1]) == data


def test_base64_size_is_checked_before_decoding() -> None:
    text = base64.b64encode(b"x" * 3000).decode()
    with pytest.raises(APIError) as refused:
        decode_base64_image(text, 2000)
    assert refused.value.status_code == 413
    wrapped = base64.encodebytes(b"x" * 1500).decode()  # newlines make the text longer, not the image
    assert decode_base64_image(wrapped, 1500) == b"x" * 1500
