"""The records that tell the gateway which worker holds a picture decoded (``Keys.image_input_owner``,
read by ``ROUTE_HOLDER_LUA``): a job with pictures this worker holds is then handed to it without a
decode hop. The records follow the cache (``image_inputs``), so a job is not sent to a worker that
dropped its pictures only to come back to decoding:

- a done job's pictures, in its FINISH's MULTI: held -> the record names this worker (TTL
  ``VLMQ_IMAGE_TTL_S``, the uploaded bytes' own); not held (too large for the cache, or evicted while
  the job ran) -> deleted if it names this worker;
- a picture the cache evicted -> its records deleted with the next done job's (if they still name
  this worker: ``DEL_IF_OWNER_LUA``).

A record is per ``holder_scope``: a tenant's pictures are found for that tenant's jobs only. Used on
the writer thread only; the cache's ``holds`` and ``evicted`` are what cross from the main thread.
"""

from __future__ import annotations

from typing import Any

from services.inference_worker.image_inputs import ImageInputCache
from shared.jobs import DEL_IF_OWNER_LUA
from shared.jobs.routing import holder_scope
from shared.keys import Keys
from shared.schemas import JobSpec


class InputOwners:
    def __init__(self, keys: Keys, worker_id: str, cache: ImageInputCache, shared: bool, ttl_s: int) -> None:
        self.keys = keys
        self.worker_id = worker_id
        self.cache = cache
        self.shared = shared
        self.ttl_s = ttl_s
        self._scopes: dict[str, set[str]] = {}  # digest -> scopes whose record this worker wrote

    def record(self, pipe: Any, spec: JobSpec) -> None:
        """Queue on ``pipe`` the records of a job that just ended done, after the evictions'."""
        self._forget_evicted(pipe)
        if self.cache.max_bytes == 0 or not spec.use_cache:
            return
        scope = holder_scope(spec, self.shared)
        for digest in spec.image_digests():
            key = self.keys.image_input_owner(scope, digest)
            if self.cache.holds(digest):
                pipe.set(key, self.worker_id, ex=self.ttl_s)
                self._scopes.setdefault(digest, set()).add(scope)
            else:
                pipe.eval(DEL_IF_OWNER_LUA, 1, key, self.worker_id)

    def _forget_evicted(self, pipe: Any) -> None:
        while self.cache.evicted:
            digest = self.cache.evicted.popleft()
            for scope in self._scopes.pop(digest, ()):
                pipe.eval(DEL_IF_OWNER_LUA, 1, self.keys.image_input_owner(scope, digest), self.worker_id)
