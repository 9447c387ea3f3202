"""The inference streams' consumer group: the only place that speaks XREADGROUP/XAUTOCLAIM/XACK
(but for ``RETURN_TO_DECODING_LUA``, which acknowledges the entry of the job it returns atomically).

A worker reads two streams through the group ``INFERENCE_GROUP``: its own
(``Keys.worker_stream``: jobs routed to it because its caches hold their session or image) first,
then the shared one (``Keys.inference_stream``: any worker). An entry stays in its stream's
pending list until ``ack`` (after the job's terminal state is written). A live worker renews its
entries (``renew``: idle time back to 0, only for entries it still owns: never one another worker
has claimed meanwhile) so only entries of dead workers go idle long enough for ``claim_idle`` to
take them, from the shared stream or a dead worker's own.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis

from shared.keys import INFERENCE_GROUP, Keys
from shared.values import as_str

# KEYS: stream. ARGV: group, consumer, entry ids. Resets the idle time of the entries still owned
# by the consumer (owner checked atomically with XPENDING); returns those ids, and the ids of
# entries that are gone from the stream altogether (the stream was deleted or flushed: nobody else
# can own them, the run goes on and the sweeper enqueues its job again if it stalls).
RENEW_LUA = """
local owned = {}
for i = 3, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if p[1] and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
    table.insert(owned, ARGV[i])
  elseif not p[1] and #redis.call('XRANGE', KEYS[1], ARGV[i], ARGV[i]) == 0 then
    table.insert(owned, ARGV[i])
  end
end
return owned
"""


@dataclass(frozen=True)
class Entry:
    stream: str
    entry_id: str
    job_id: str


class StreamConsumer:
    def __init__(self, client: redis.Redis, keys: Keys, consumer: str, group: str = INFERENCE_GROUP):
        self.r: Any = client  # redis-py's return types are unions; the shapes are known here
        self.shared = keys.inference_stream()
        self.own = keys.worker_stream(consumer)
        self.batch = keys.batch_stream()
        self.group = group
        self.consumer = consumer
        self._claim_cursors: dict[str, str] = defaultdict(lambda: "0-0")
        self._renew = client.register_script(RENEW_LUA)

    def ensure_groups(self) -> None:
        for stream in (self.own, self.shared, self.batch):
            try:
                self.r.xgroup_create(stream, self.group, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    def read(self, count: int, block_ms: int, own_pending: bool = False) -> list[Entry]:
        """New entries, its own stream's first (or, with ``own_pending``, entries already delivered
        to this consumer name: a worker restarted under the same id takes its jobs back)."""
        if count <= 0:
            return []
        start = "0" if own_pending else ">"
        streams = {self.own: start, self.shared: start}
        if own_pending:
            streams[self.batch] = start
        reply = self.r.xreadgroup(
            self.group, self.consumer, streams, count=count, block=None if own_pending else block_ms
        )
        return [e for stream, items in reply or [] for e in _entries(as_str(stream), items)]

    def read_batch(self, count: int) -> list[Entry]:
        """New batch-priority entries (never blocks: interactive work is read first)."""
        if count <= 0:
            return []
        reply = self.r.xreadgroup(self.group, self.consumer, {self.batch: ">"}, count=count)
        return [e for stream, items in reply or [] for e in _entries(as_str(stream), items)]

    def claim_idle(self, min_idle_ms: int, count: int, streams: Iterable[str]) -> list[Entry]:
        """Entries idle for ``min_idle_ms`` (their worker died), now delivered to this consumer."""
        claimed: list[Entry] = []
        for stream in streams:
            if len(claimed) >= count:
                break
            try:
                reply = self.r.xautoclaim(
                    stream,
                    self.group,
                    self.consumer,
                    min_idle_ms,
                    start_id=self._claim_cursors[stream],
                    count=count - len(claimed),
                )
            except redis.ResponseError:  # a dead worker's stream already gone (NOGROUP)
                self._claim_cursors.pop(stream, None)
                continue
            self._claim_cursors[stream] = as_str(reply[0])
            claimed += _entries(stream, reply[1])
        return claimed

    def renew(self, entries: list[Entry]) -> set[str]:
        """Reset the idle time of entries this worker still owns; returns the ids it no longer owns."""
        by_stream: dict[str, list[str]] = defaultdict(list)
        for entry in entries:
            by_stream[entry.stream].append(entry.entry_id)
        lost: set[str] = set()
        for stream, ids in by_stream.items():
            owned = self._renew(keys=[stream], args=[self.group, self.consumer, *ids])
            lost |= set(ids) - {as_str(e) for e in owned}
        return lost

    def ack(self, pipe: redis.client.Pipeline, entry: Entry) -> None:
        """Queue XACK + XDEL on ``pipe``: a stream only holds unfinished work."""
        pipe.xack(entry.stream, self.group, entry.entry_id)
        pipe.xdel(entry.stream, entry.entry_id)

    def prune_consumers(self, min_idle_ms: int = 600_000) -> int:
        """Forget consumers (workers gone long ago) that hold no pending entries; returns how many."""
        pruned = 0
        for info in self.r.xinfo_consumers(self.shared, self.group):
            name = as_str(info["name"])
            if name != self.consumer and int(info["pending"]) == 0 and int(info["idle"]) >= min_idle_ms:
                pruned += int(self.r.xgroup_delconsumer(self.shared, self.group, name) == 0)
        return pruned


def _entries(stream: str, items: list) -> list[Entry]:  # type: ignore[type-arg]
    out = []
    for entry_id, fields in items:
        job_id = (fields or {}).get(b"job_id") or (fields or {}).get("job_id") or b""  # "" = deleted entry
        out.append(Entry(stream, as_str(entry_id), as_str(job_id)))
    return out
