"""The records that tell the gateway which worker holds a picture decoded (``Keys.image_input_owner``,
read by ``ROUTE_HOLDER_LUA``): a job with pictures this worker holds is then handed to it without a
decode hop. The records follow the cache (``image_inputs``), so a job is rarely sent to a worker
that dropped its pictures only to come back to decoding:

- a done job's pictures, in its FINISH's MULTI (``record``): held -> the record names this worker
  (TTL ``VLMQ_IMAGE_TTL_S``, the uploaded bytes' own); not held (too large for the cache, or evicted
  while the job ran) -> deleted if it names this worker (``DEL_IF_OWNER_LUA``: never another's);
- the pictures the cache evicted since -> their records deleted in that same MULTI, and again in
  each later one until one of them went through (``written``: a MULTI retried after a lost
  connection is built anew);
- a job handed here whose pictures are not held after all (``forget_unheld``, beside its return to
  decoding): the records that sent it, so the next job with them is decoded at once.

A record is per ``holder_scope``: a tenant's pictures are found for that tenant's jobs only.
``record`` and ``written`` run on the writer thread, which alone knows what it recorded;
``forget_unheld`` reads only the cache's ``holds`` (any thread).
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
        self._pending: dict[str, set[str]] = {}  # evicted digest -> scopes whose record is to go

    def record(self, pipe: Any, spec: JobSpec) -> None:
        """Queue on ``pipe`` the evicted pictures' deletions, then a done job's records."""
        while self.cache.evicted:
            digest = self.cache.evicted.popleft()
            self._pending.setdefault(digest, set()).update(self._scopes.pop(digest, ()))
        for digest, scopes in self._pending.items():
            for scope in scopes:
                self._delete(pipe, scope, digest)
        if self.cache.max_bytes == 0 or not spec.use_cache:
            return
        scope = holder_scope(spec, self.shared)
        for digest in spec.image_digests():
            if self.cache.holds(digest):  # after its deletion in this MULTI: recorded in the end
                pipe.set(self.keys.image_input_owner(scope, digest), self.worker_id, ex=self.ttl_s)
                self._scopes.setdefault(digest, set()).add(scope)
                self._pending.get(digest, set()).discard(scope)
            else:
                self._delete(pipe, scope, digest)

    def written(self) -> None:
        """The MULTI ``record`` filled went through: the evicted pictures' records are gone."""
        self._pending.clear()

    def forget_unheld(self, pipe: Any, spec: JobSpec) -> None:
        """Queue the deletion of this worker's records of the job's pictures it does not hold."""
        scope = holder_scope(spec, self.shared)
        for digest in spec.image_digests():
            if not self.cache.holds(digest):
                self._delete(pipe, scope, digest)

    def _delete(self, pipe: Any, scope: str, digest: str) -> None:
        pipe.eval(DEL_IF_OWNER_LUA, 1, self.keys.image_input_owner(scope, digest), self.worker_id)
