"""Stream slots: one per open event stream (SSE, WebSocket, a waiting OpenAI request), per process.

Each stream holds a connection of the stream pool during its blocking reads, so the pool's size
(``stream_connections``) is the number of slots. A slot is taken before the response starts
(a full pool is a 503, never a 200 cut off later) and given back when the stream ends, whatever
ends it. Taking is synchronous (no await between the check and the count), so concurrent
requests of one event loop can never take more than the limit.
"""

from __future__ import annotations

from typing import Any

from sse_starlette import EventSourceResponse
from starlette.types import Receive, Scope, Send

from gateway.errors import APIError


class StreamSlots:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self) -> StreamSlot:
        """A slot, or 503 ``streams_full`` when every one is in use."""
        if self.used >= self.limit:
            raise APIError(
                503,
                f"too many open streams ({self.used}); poll GET /v1/jobs/{{id}} or retry shortly",
                code="streams_full",
                headers={"Retry-After": "1"},
            )
        self.used += 1
        return StreamSlot(self)


class StreamSlot:
    def __init__(self, slots: StreamSlots) -> None:
        self._slots: StreamSlots | None = slots

    def release(self) -> None:
        """Give the slot back (idempotent)."""
        if self._slots is not None:
            self._slots.used -= 1
            self._slots = None

    def __enter__(self) -> StreamSlot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class SlotEventSourceResponse(EventSourceResponse):
    """An SSE response that gives its stream slot back when it ends (completed, client gone, cancelled)."""

    def __init__(self, *args: Any, slot: StreamSlot, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.slot = slot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.slot.release()
