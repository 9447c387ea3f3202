"""Minimal SSE / WebSocket readers for tests (real HTTP, real sockets)."""

from __future__ import annotations

import json
from typing import Any

import httpx
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed


async def read_sse(
    client: httpx.AsyncClient, url: str, headers: dict[str, str] | None = None, limit: int = 1000
) -> list[dict[str, Any]]:
    """All SSE events of ``url`` until the server ends the stream: [{id, event, data}]."""
    events: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    async with client.stream("GET", url, headers=headers) as resp:
        assert resp.status_code == 200, await resp.aread()
        async for line in resp.aiter_lines():
            if not line:
                if "data" in current:
                    events.append(current)
                    if len(events) >= limit:
                        break
                current = {}
            elif line.startswith(":"):
                continue
            else:
                key, _, value = line.partition(":")
                value = value.removeprefix(" ")
                current[key] = json.loads(value) if key == "data" and value.startswith("{") else value
    return events


async def read_ws(url: str, limit: int = 1000) -> tuple[list[dict[str, Any]], int | None]:
    """JSON messages until the server closes (or ``limit``), and the close code."""
    messages: list[dict[str, Any]] = []
    async with connect(url) as ws:
        try:
            async for raw in ws:
                messages.append(json.loads(raw))
                if len(messages) >= limit:
                    return messages, None
        except ConnectionClosed:  # closed with an error code: the code says why
            pass
        return messages, ws.close_code


def token_text(events: list[dict[str, Any]]) -> str:
    return "".join(e["text"] for e in events if e["type"] == "token")
