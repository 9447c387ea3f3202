"""The engine's three caches behind one small interface, ``BoundedCache``.

Rules every cache follows (tests check them through ``check_integrity``):

- **Bounded by bytes, LRU.** ``put`` evicts least-recently-used entries until the new one fits; an entry
  larger than the whole budget is not stored. ``bytes`` always equals the sum of the entries' sizes.
- **Immutable entries.** Stored tensors are owned by the cache (callers put copies nobody else
  writes: cloned features, KV extracted from the batch) and never written
  afterwards; readers slice them and never write in place. A checksum taken at ``put`` proves it
  where ``BoundedCache.record_checksums`` is on (the tests turn it on: reading every stored tensor
  costs ~0.1 ms a put, a few percent of a request, for a check only tests run).
  One exception, by design: a session entry's first tokens (the system prompt) may be views of a
  prefix-cache entry (``KVEntry.shared``), owned and counted by the prefix cache, not copied per
  conversation (prefix entries are the few prewarmed system prompts).
- **Counted lookups.** Every lookup counts one hit or one miss; a hit refreshes recency. An entry past
  its TTL is dropped and counts as a miss.
- **One lock.** The engine thread writes; the vision prefetcher only peeks. Every read or change of
  the slots, the LRU order and the counters, in the base class and in the subclasses' ``match``,
  holds the cache's lock, so a peek never sees the LRU order half-updated.

``PrefixCache`` (system-prompt KV, filled by prewarm), ``SessionCache`` (KV of a conversation, per
session id, TTL) and ``ImageCache`` (vision-encoder output by the full sha256 of the image bytes).
KV entries are matched by the longest common token prefix with the new prompt; image tokens only
match when the image digests match too (equal placeholder ids never imply equal images).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch

from services.engine.sequence import ImageSpan, Prompt

K = TypeVar("K")
V = TypeVar("V")
KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (1, heads, tokens, head_dim)


class CacheIntegrityError(AssertionError):
    pass


@dataclass(frozen=True)
class CacheStats:
    hits: int
    misses: int
    evictions: int
    entries: int
    bytes: int
    capacity_bytes: int

    def to_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class _Slot(Generic[V]):
    value: V
    nbytes: int
    checksum: float | None  # of the tensors at ``put`` (``record_checksums``), else None
    expires_at: float


class BoundedCache(Generic[K, V]):
    record_checksums = False  # checksum every put, for ``check_integrity``'s content check (tests)

    def __init__(self, name: str, capacity_bytes: int, ttl_s: float | None = None) -> None:
        self.name = name
        self.capacity = capacity_bytes
        self.ttl_s = ttl_s
        self._slots: OrderedDict[K, _Slot[V]] = OrderedDict()
        self._lock = threading.RLock()
        self.bytes = self.hits = self.misses = self.evictions = 0

    # hooks for subclasses
    def _tensors(self, value: V) -> list[torch.Tensor]:
        raise NotImplementedError

    def _validate(self, key: K, value: V) -> None:
        """Structural check of one entry; raise CacheIntegrityError."""

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self.peek(key)
            self._count(value is not None)
            if value is not None:
                self._slots.move_to_end(key)
            return value

    def _count(self, hit: bool) -> None:
        """One lookup; callers hold ``_lock`` (every change of ``_slots`` or a counter does)."""
        self.hits += hit
        self.misses += not hit

    def peek(self, key: K) -> V | None:
        """Lookup without counting or refreshing recency (drops the entry if expired)."""
        with self._lock:
            slot = self._slots.get(key)
            if slot is not None and slot.expires_at <= time.monotonic():
                self.pop(key)
                return None
            return slot.value if slot else None

    def put(self, key: K, value: V) -> bool:
        nbytes = sum(t.numel() * t.element_size() for t in self._tensors(value))
        checksum = self._checksum(value) if self.record_checksums else None
        with self._lock:
            self.pop(key)
            if nbytes > self.capacity:
                return False
            while self.bytes + nbytes > self.capacity:
                self._evict_lru()
            expires = time.monotonic() + self.ttl_s if self.ttl_s is not None else float("inf")
            self._slots[key] = _Slot(value, nbytes, checksum, expires)
            self.bytes += nbytes
            return True

    def pop(self, key: K) -> V | None:
        with self._lock:
            slot = self._slots.pop(key, None)
            if slot is None:
                return None
            self.bytes -= slot.nbytes
            return slot.value

    def keys(self) -> list[K]:
        with self._lock:
            return list(self._slots)

    def _evict_lru(self) -> None:
        key = next(iter(self._slots))
        self.pop(key)
        self.evictions += 1

    def _checksum(self, value: V) -> float:
        return float(sum(t.double().sum().item() for t in self._tensors(value)))

    def check_integrity(self, deep: bool = True) -> None:
        """Byte accounting, bound, per-entry structure and (``deep``) checksums of the stored tensors
        (of entries put while ``record_checksums`` was on)."""
        with self._lock:
            self._check_integrity(deep)

    def _check_integrity(self, deep: bool) -> None:
        total = 0
        for key, slot in self._slots.items():
            size = sum(t.numel() * t.element_size() for t in self._tensors(slot.value))
            if size != slot.nbytes:
                raise CacheIntegrityError(f"{self.name}[{key!r}]: size changed {slot.nbytes} -> {size}")
            self._validate(key, slot.value)
            if deep and slot.checksum is not None and self._checksum(slot.value) != slot.checksum:
                raise CacheIntegrityError(f"{self.name}[{key!r}]: tensor contents changed after put")
            total += size
        if total != self.bytes or self.bytes > self.capacity:
            raise CacheIntegrityError(
                f"{self.name}: bytes {self.bytes} (actual {total}), cap {self.capacity}"
            )

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(
                self.hits, self.misses, self.evictions, len(self._slots), self.bytes, self.capacity
            )


@dataclass(frozen=True)
class KVEntry:
    """KV of ``tokens`` (one sequence, no padding) and the images among them: ``shared`` holds the
    first tokens' KV as views of a prefix-cache entry (none for prefix entries), ``kv`` the rest."""

    tokens: tuple[int, ...]
    spans: tuple[ImageSpan, ...]
    kv: KV
    shared: KV | None = None

    @property
    def shared_len(self) -> int:
        return self.shared[0][0].shape[-2] if self.shared else 0

    def head(self, m: int) -> KV:
        """The first ``m`` tokens' KV: views, or one copy where it spans the shared and own parts."""
        s = self.shared_len
        if self.shared and m <= s:
            return [(k[:, :, :m], v[:, :, :m]) for k, v in self.shared]
        own = [(k[:, :, : m - s], v[:, :, : m - s]) for k, v in self.kv]
        if not self.shared:
            return own
        return [
            (torch.cat([sk, k], dim=-2), torch.cat([sv, v], dim=-2))
            for (sk, sv), (k, v) in zip(self.shared, own, strict=True)
        ]

    def match_length(self, prompt: Prompt) -> int:
        """Longest reusable prefix for ``prompt``: common tokens, cut before the first image whose digest
        differs, and leaving at least one prompt token to prefill (it yields the first logits)."""
        ids = prompt.token_ids
        n = min(len(self.tokens), len(ids) - 1)
        m = next((i for i in range(n) if self.tokens[i] != ids[i]), n)
        theirs = {s.start: s.digest for s in prompt.spans}
        for span in self.spans:
            if span.start < m and theirs.get(span.start) != span.digest:
                m = span.start
        return max(m, 0)


class _KVCache(BoundedCache[K, KVEntry]):
    def _tensors(self, value: KVEntry) -> list[torch.Tensor]:
        return [t for kv in value.kv for t in kv]

    def _validate(self, key: K, value: KVEntry) -> None:
        own = len(value.tokens) - value.shared_len
        for k, v in value.kv:
            if k.shape[0] != 1 or k.shape[-2] != own or k.shape != v.shape:
                raise CacheIntegrityError(f"{self.name}[{key!r}]: KV shape {tuple(k.shape)} vs tokens")
        for k, v in value.shared or []:
            if k.shape[0] != 1 or k.shape[-2] != value.shared_len or k.shape != v.shape:
                raise CacheIntegrityError(f"{self.name}[{key!r}]: shared KV shape {tuple(k.shape)}")


class PrefixCache(_KVCache[tuple[int, ...]]):
    def __init__(self, capacity_bytes: int) -> None:
        super().__init__("prefix", capacity_bytes)

    def match(self, prompt: Prompt) -> tuple[KVEntry | None, int]:
        """The entry sharing the longest reusable prefix with ``prompt``; only that one is refreshed."""
        with self._lock:
            best: tuple[tuple[int, ...] | None, KVEntry | None, int] = (None, None, 0)
            for key, slot in self._slots.items():
                m = slot.value.match_length(prompt)
                if m > best[2]:
                    best = (key, slot.value, m)
            best_key, entry, m = best
            self._count(m > 0)
            if best_key is not None:
                self._slots.move_to_end(best_key)  # after the loop: never while iterating
            return entry, m

    def add(self, entry: KVEntry) -> bool:
        if entry.shared:
            raise ValueError("a prefix entry owns all its KV")
        return self.put(entry.tokens, entry)

    def _validate(self, key: tuple[int, ...], value: KVEntry) -> None:
        super()._validate(key, value)
        if key != value.tokens:
            raise CacheIntegrityError("prefix: key is not the entry's tokens")


class SessionCache(_KVCache[str]):
    def __init__(self, capacity_bytes: int, ttl_s: float) -> None:
        super().__init__("session", capacity_bytes, ttl_s)

    def match(self, session_id: str, prompt: Prompt) -> tuple[KVEntry | None, int]:
        with self._lock:
            entry = self.peek(session_id)  # isolation: only this session's own entry is ever looked at
            m = entry.match_length(prompt) if entry else 0
            self._count(m > 0)
            if m:
                self._slots.move_to_end(session_id)
            return (entry, m) if m else (None, 0)


class ImageCache(BoundedCache[str, torch.Tensor]):
    def __init__(self, capacity_bytes: int) -> None:
        super().__init__("image", capacity_bytes)

    def _tensors(self, value: torch.Tensor) -> list[torch.Tensor]:
        return [value]

    def _validate(self, key: str, value: torch.Tensor) -> None:
        if len(key) != 64 or value.ndim != 2:
            raise CacheIntegrityError(f"image[{key!r}]: bad key or features shape {tuple(value.shape)}")
