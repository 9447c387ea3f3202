"""Reading a job's event stream (docs/service-contract.md §Event streams).

The Redis entry id is the event id. Readers ``XREAD BLOCK`` from the last id with a bounded
block time, and stop after the terminal event. A retried attempt continues from the highest
published token index, so ``TokenFilter`` keeps each token index once: no duplicate even if
an attempt re-sends tokens, and the text never mixes two attempts' versions of a token.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from gateway.errors import APIError
from gateway.shutdown import server_exiting
from shared.keys import Keys
from shared.schemas import TERMINAL_STATUSES, JobEvent
from shared.values import as_str

BLOCK_MS = 1000  # bounded: a reader re-checks the job between blocks (expiry, terminal state)
_EVENT_ID = re.compile(r"([0-9]{1,20})(?:-([0-9]{1,20}))?", re.ASCII)
_U64 = 2**64


def check_event_id(value: str | None) -> str:
    """A client-supplied Last-Event-ID, or "0" (from the start). Checked here as Redis would (two
    unsigned 64-bit parts) so a bad one is a 400, never a Redis error."""
    if value is None or value == "":
        return "0"
    match = _EVENT_ID.fullmatch(value)
    if match is None or any(int(part) >= _U64 for part in match.groups() if part is not None):
        shown = ascii(value if len(value) <= 64 else value[:64] + "...")
        raise APIError(
            400,
            f"last_event_id: {shown} is not a stream id like 1700000000000-0",
            param="last_event_id",
            code="bad_event_id",
        )
    return value


def is_terminal(event: JobEvent) -> bool:
    if event.type in ("done", "error"):
        return True
    return event.type == "status" and event.status in TERMINAL_STATUSES


@dataclass
class TokenFilter:
    """Accepts each completion-token index once (the contract's exactly-once rule)."""

    next_index: int = 0

    def accept(self, event: JobEvent) -> bool:
        if event.type != "token":
            return True
        index = event.index if event.index is not None else self.next_index
        if index < self.next_index:
            return False  # already published by an earlier attempt
        self.next_index = index + max(1, len(event.token_ids or ()))
        return True


async def read_all(
    redis: aioredis.Redis, keys: Keys, job_id: str, upto: str = "+"
) -> list[tuple[str, JobEvent]]:
    """Events already in the stream (non-blocking), filtered."""
    entries: Any = await redis.xrange(keys.job_events(job_id), min="-", max=upto)
    tokens = TokenFilter()
    out = []
    for entry_id, fields in entries:
        event = JobEvent.from_fields(fields)
        if tokens.accept(event):
            out.append((as_str(entry_id), event))
    return out


async def primed_filter(redis: aioredis.Redis, keys: Keys, job_id: str, last_id: str) -> TokenFilter:
    """The filter state a reader had after ``last_id`` (for a resumed stream)."""
    tokens = TokenFilter()
    if last_id != "0":
        for _, event in await read_all(redis, keys, job_id, upto=last_id):
            tokens.accept(event)
    return tokens


def text_of(events: list[tuple[str, JobEvent]]) -> str:
    return "".join(e.text or "" for _, e in events if e.type == "token")


async def follow(
    redis: aioredis.Redis,
    keys: Keys,
    job_id: str,
    last_id: str = "0",
    block_ms: int = BLOCK_MS,
    on_idle: Callable[[], Awaitable[object]] | None = None,
    block_first: bool = False,
) -> AsyncIterator[tuple[str, JobEvent]]:
    """Events after ``last_id`` as they come, ending with the terminal event.

    ``on_idle`` runs whenever a read found nothing new (the gateway's lazy expiry check).
    ``block_first``: a job this request just accepted (``last_id``: its queued event, or "0"): the
    first read blocks too (whatever is already there returns at once), and no token can be behind
    ``last_id``, so no read primes the token filter.

    Ends early, without a terminal event, when the job record is gone (expired), when the
    terminal event is already behind ``last_id`` (a client resuming a finished stream), or
    when the server shuts down (the client resumes elsewhere with its last id).
    """
    key = keys.job_events(job_id)
    tokens = TokenFilter() if block_first else await primed_filter(redis, keys, job_id, last_id)
    block: int | None = block_ms if block_first else None  # else a finished stream ends at once
    while True:
        reply: Any = await redis.xread({key: last_id}, count=256, block=block)
        block = block_ms
        if not reply:
            if on_idle is not None:
                await on_idle()
            if server_exiting() or await _finished_or_gone(redis, keys, job_id, key, last_id):
                return
            continue
        for entry_id, fields in reply[0][1]:
            last_id = as_str(entry_id)
            event = JobEvent.from_fields(fields)
            if not tokens.accept(event):
                continue
            yield last_id, event
            if is_terminal(event):
                return


async def _finished_or_gone(redis: aioredis.Redis, keys: Keys, job_id: str, key: str, last_id: str) -> bool:
    status = await redis.hget(keys.job(job_id), "status")
    if status is None:
        return True
    if as_str(status) not in {s.value for s in TERMINAL_STATUSES}:
        return False
    # Terminal: anything left after last_id would have been returned by the XREAD above,
    # unless it was written just now; one non-blocking read settles it.
    return not await redis.xread({key: last_id}, count=1)
