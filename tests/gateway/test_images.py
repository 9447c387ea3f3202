"""Large payloads are hashed and decoded off the event loop; small ones inline."""

from __future__ import annotations

import asyncio
import base64
import io
import os
from collections.abc import Awaitable, Callable
from typing import Any

from PIL import Image

from gateway.image_checks import INLINE_LIMIT, decode_base64_image_async, inspect_image_async


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
    big = noise_png(700)
    assert len(big) > INLINE_LIMIT
    info, turns = await loop_turns_during(lambda: inspect_image_async(big, 10**8, 10**8))
    assert info.width == 700 and turns > 0
    text = base64.b64encode(big).decode()
    data, turns = await loop_turns_during(lambda: decode_base64_image_async(text, 10**8))
    assert data == big and turns > 0


async def test_small_payloads_are_handled_inline() -> None:
    small = noise_png(16)
    assert len(small) < INLINE_LIMIT
    info, turns = await loop_turns_during(lambda: inspect_image_async(small, 10**8, 10**8))
    assert info.width == 16 and turns <= 1
