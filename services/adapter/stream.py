"""The inference stream's consumer group: the only place that speaks XREADGROUP/XAUTOCLAIM/XACK.

An entry stays in the group's pending list until ``ack`` (after the job's terminal state is
written). A live worker renews its entries (``renew``: XCLAIM to itself, idle time back to
0) so only entries of dead workers go idle long enough for ``claim_idle`` to take them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from shared.keys import INFERENCE_GROUP


@dataclass(frozen=True)
class Entry:
    entry_id: str
    job_id: str


class StreamConsumer:
    def __init__(self, client: redis.Redis, stream: str, consumer: str, group: str = INFERENCE_GROUP):
        self.r: Any = client  # redis-py's return types are unions; the shapes are known here
        self.stream = stream
        self.group = group
        self.consumer = consumer
        self._claim_cursor = "0-0"

    def ensure_group(self) -> None:
        try:
            self.r.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def read(self, count: int, block_ms: int, own_pending: bool = False) -> list[Entry]:
        """New entries (or, with ``own_pending``, entries already delivered to this consumer name)."""
        if count <= 0:
            return []
        start = "0" if own_pending else ">"
        reply = self.r.xreadgroup(
            self.group,
            self.consumer,
            {self.stream: start},
            count=count,
            block=None if own_pending else block_ms,
        )
        return [e for _stream, items in reply or [] for e in _entries(items)]

    def claim_idle(self, min_idle_ms: int, count: int) -> list[Entry]:
        """Entries idle for ``min_idle_ms`` (their worker died), now delivered to this consumer."""
        if count <= 0:
            return []
        reply = self.r.xautoclaim(
            self.stream, self.group, self.consumer, min_idle_ms, start_id=self._claim_cursor, count=count
        )
        self._claim_cursor = _str(reply[0])
        return list(_entries(reply[1]))

    def renew(self, entry_ids: list[str]) -> None:
        """Reset the idle time of entries this worker is still working on (no delivery count bump)."""
        if entry_ids:
            self.r.xclaim(self.stream, self.group, self.consumer, 0, entry_ids, justid=True)

    def ack(self, pipe: redis.client.Pipeline, entry_id: str) -> None:
        """Queue XACK + XDEL on ``pipe``: the stream only holds unfinished work."""
        pipe.xack(self.stream, self.group, entry_id)
        pipe.xdel(self.stream, entry_id)

    def prune_consumers(self, min_idle_ms: int = 600_000) -> int:
        """Forget consumers (workers gone long ago) that hold no pending entries; returns how many."""
        pruned = 0
        for info in self.r.xinfo_consumers(self.stream, self.group):
            name = _str(info["name"])
            if name != self.consumer and int(info["pending"]) == 0 and int(info["idle"]) >= min_idle_ms:
                pruned += int(self.r.xgroup_delconsumer(self.stream, self.group, name) == 0)
        return pruned

    def pending_count(self) -> int:
        info = self.r.xpending(self.stream, self.group)
        return int(info["pending"]) if info else 0


def _entries(items: list) -> list[Entry]:  # type: ignore[type-arg]
    out = []
    for entry_id, fields in items:
        job_id = (fields or {}).get(b"job_id") or (fields or {}).get("job_id") or b""  # "" = deleted entry
        out.append(Entry(_str(entry_id), _str(job_id)))
    return out


def _str(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
