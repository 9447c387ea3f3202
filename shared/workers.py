"""The inference workers' registry: who is alive, read without scanning the keyspace.

Each worker writes its heartbeat (JSON stats, TTL ``worker_stale_s``) at ``Keys.worker_heartbeat``
and its id into the sorted set ``Keys.workers`` scored by the beat's time. Readers (``/readyz``,
``/metrics``, `make up`, tests) take the ids beaten within ``stale_s`` and MGET their
heartbeats: O(workers), whatever else Redis holds.
"""

from __future__ import annotations

import json
from typing import Any

from shared.keys import Keys

FORGET_AFTER_S = 3600.0  # ids of workers silent this long leave the set


def publish(pipe: Any, keys: Keys, beat: dict[str, Any], ttl_ms: int) -> None:
    """Queue a worker's heartbeat on ``pipe`` (``beat`` has ``worker_id`` and ``ts``)."""
    worker_id, ts = str(beat["worker_id"]), float(beat["ts"])
    pipe.set(keys.worker_heartbeat(worker_id), json.dumps(beat, default=str), px=ttl_ms)
    pipe.zadd(keys.workers(), {worker_id: ts})
    pipe.zremrangebyscore(keys.workers(), "-inf", ts - FORGET_AFTER_S)


def withdraw(pipe: Any, keys: Keys, worker_id: str) -> None:
    """Queue the removal of a stopping worker's heartbeat and id."""
    pipe.delete(keys.worker_heartbeat(worker_id))
    pipe.zrem(keys.workers(), worker_id)


def heartbeat_keys(keys: Keys, worker_ids: list[Any]) -> list[str]:
    return [keys.worker_heartbeat(w.decode() if isinstance(w, bytes) else str(w)) for w in worker_ids]


def parse(values: list[Any]) -> list[dict[str, Any]]:
    """MGET replies -> heartbeat dicts (gone or unreadable ones skipped)."""
    beats = []
    for raw in values:
        try:
            beat = json.loads(raw)
        except (TypeError, ValueError):
            continue
        if isinstance(beat, dict):
            beats.append(beat)
    return beats


def live_sync(client: Any, keys: Keys, stale_s: float, now: float) -> list[dict[str, Any]]:
    """Heartbeats of the workers beaten within ``stale_s`` (a sync client)."""
    ids = client.zrangebyscore(keys.workers(), now - stale_s, "+inf")
    return parse(client.mget(heartbeat_keys(keys, ids))) if ids else []
