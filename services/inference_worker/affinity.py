"""Cache-aware routing, the inference worker's side.

A worker that finishes a job records itself as the owner of the job's session KV (its affinity
key) and of its image's features, with the TTLs of those caches; the decode worker hands the next
job with that key or image to the owner's own stream when the owner is alive (``ROUTE_LUA``).
What keeps a routed job from waiting on its owner, run by every worker now and then
(``Rebalancer.rebalance``):

- a live owner that has not read an entry within ``affinity_max_wait_ms`` (busy): the entry
  moves to the shared stream, where any worker takes it;
- a dead owner (no heartbeat): every entry it never read moves at once, and the entries it read
  and never finished are claimed from its stream by XAUTOCLAIM like the shared stream's
  (``claim_streams``). The conversation is then rebuilt from the stored turns: a correct answer,
  only slower.
"""

from __future__ import annotations

import time
from typing import Any

from shared import workers
from shared.config import InferenceSettings
from shared.jobs import MOVE_UNREAD_LUA
from shared.keys import INFERENCE_GROUP, Keys
from shared.schemas import JobSpec
from shared.values import as_str

MOVE_BATCH = 256  # entries moved per stream per pass

# KEYS: a dead worker's stream, the workers' registry. ARGV: its id. Only an empty stream goes.
FORGET_LUA = """
if redis.call('XLEN', KEYS[1]) > 0 then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
"""


def record_owner(pipe: Any, keys: Keys, spec: JobSpec, worker_id: str, settings: InferenceSettings) -> None:
    """Queue the owner records of a job this worker just finished with its caches on."""
    if not spec.use_cache:
        return
    if spec.affinity_key and settings.session_cache:
        pipe.set(keys.session_owner(spec.affinity_key), worker_id, ex=settings.session_ttl_s)
    if settings.image_cache:
        for digest in spec.image_digests():
            pipe.set(keys.image_owner(digest), worker_id, ex=settings.image_ttl_s)


class Rebalancer:
    def __init__(self, client: Any, settings: InferenceSettings, worker_id: str) -> None:
        self.r = client
        self.keys = settings.keys
        self.settings = settings
        self.worker_id = worker_id
        self.period_s = max(0.05, settings.affinity_max_wait_ms / 2000)
        self._move = client.register_script(MOVE_UNREAD_LUA)

    def registered(self) -> tuple[set[str], set[str]]:
        """(every worker id in the registry, the live ones)."""
        now = time.time()
        everyone = {as_str(w) for w in self.r.zrange(self.keys.workers(), 0, -1)}
        beats = workers.live_sync(self.r, self.keys, self.settings.worker_stale_s, now)
        return everyone, {str(b.get("worker_id")) for b in beats}

    def rebalance(self) -> int:
        """Move the entries routed workers did not read in time to the shared stream; how many."""
        everyone, live = self.registered()
        now_ms = int(time.time() * 1000)
        moved = 0
        for worker_id in everyone:
            cutoff = f"{now_ms - self.settings.affinity_max_wait_ms}-0" if worker_id in live else "+"
            moved += int(
                self._move(
                    keys=[self.keys.worker_stream(worker_id), self.keys.inference_stream()],
                    args=[INFERENCE_GROUP, cutoff, MOVE_BATCH, self.keys.job("")],
                )
            )
            if worker_id not in live:
                self._forget(worker_id)
        return moved

    def _forget(self, worker_id: str) -> None:
        """A dead worker whose stream is empty (everything moved or claimed and finished) is gone for good."""
        stream = self.keys.worker_stream(worker_id)
        self.r.eval(FORGET_LUA, 2, stream, self.keys.workers(), worker_id)

    def claim_streams(self) -> list[str]:
        """Streams whose pending entries may be nobody's: the shared one, the dead's own, and this
        worker's own (an entry whose run it forgot: a Redis failover took back its FINISH and XACK;
        the entries it runs are renewed every heartbeat, so they never go idle)."""
        everyone, live = self.registered()
        dead = sorted(everyone - live - {self.worker_id})
        own = self.keys.worker_stream(self.worker_id)
        shared = [self.keys.inference_stream(), self.keys.batch_stream()]
        return [*shared, own, *(self.keys.worker_stream(w) for w in dead)]
