"""Decoded images the inference worker keeps by digest, so a turn that shows no new image needs no
decode hop (``gateway.handoff``: such a turn comes marked ``decode_skipped``, without pixels).

An entry is the image as its decode worker shipped it (``ImageProcessorHandle.wire``: the resized
uint8 picture, 168 x 168 x 3 = 85 KB for the bundled model), not the engine's float32 input made
from it (677 KB: a still image's patches twice over, four bytes each), so the same bytes hold 8x the
pictures (2x for a processor that does not split at its resize: it ships float16). A turn served
from here runs the same last steps as fresh pixels (``engine_request.wire_inputs``, ~0.1 ms hot), so
it gets the input, and the answer, it would get from fresh pixels, bit for bit. The bound is in
bytes (the tensors' sizes); least recently used goes first. The main thread fills and reads it; the
writer thread only asks ``holds`` and takes ``evicted`` (``input_owners``: the owner records the
gateway routes by). Never filled from image bytes: a worker opens no bytes itself (a client can send
a history of invented pictures; only a decode worker, isolated, may decode them).
"""

from __future__ import annotations

from collections import OrderedDict, deque

import torch

Wire = dict[str, torch.Tensor]  # one image as a decode worker ships it (``ImageProcessorHandle.wire``)


class PixelsNeeded(Exception):
    """A turn handed over without pixels whose images this worker does not hold."""


def wire_bytes(wire: Wire) -> int:
    return sum(t.element_size() * t.nelement() for t in wire.values())


class ImageInputCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, Wire] = OrderedDict()
        self._sizes: dict[str, int] = {}
        self.bytes = 0
        self.hits = 0  # lookups (one a job with images) served whole from here
        self.misses = 0
        self.evictions = 0
        self.returned = 0  # jobs without pixels it could not serve (sent back to decoding)
        self.evicted: deque[str] = deque()  # digests dropped, for the writer thread (thread-safe ends)

    def get_all(self, digests: list[str]) -> dict[str, Wire] | None:
        """Every one of ``digests``, or None when one is missing (a miss: nothing moves)."""
        if not digests or any(d not in self._entries for d in digests):
            self.misses += 1
            return None
        self.hits += 1
        for digest in digests:
            self._entries.move_to_end(digest)
        return {d: self._entries[d] for d in digests}

    def holds(self, digest: str) -> bool:
        """Any thread: one dict lookup, atomic under the GIL."""
        return digest in self._entries

    def put_all(self, images: dict[str, Wire]) -> None:
        for digest, wire in images.items():
            self._put(digest, wire)

    def _put(self, digest: str, wire: Wire) -> None:
        size = wire_bytes(wire)
        if size > self.max_bytes:
            return
        if digest in self._entries:  # stored again: replaced in place (never missing for ``holds``)
            self.bytes += size - self._sizes[digest]
            self._entries[digest], self._sizes[digest] = wire, size
            self._entries.move_to_end(digest)
        else:
            self._entries[digest], self._sizes[digest] = wire, size
            self.bytes += size
        while self.bytes > self.max_bytes:
            oldest = next(iter(self._entries))  # never ``digest`` itself: it is the newest, and fits
            self._drop(oldest)
            self.evicted.append(oldest)
            self.evictions += 1

    def _drop(self, digest: str) -> None:
        if self._entries.pop(digest, None) is not None:
            self.bytes -= self._sizes.pop(digest)

    def stats(self) -> dict[str, int]:
        """The engine caches' figures (the gateway's /metrics shows it as ``cache="image_input"``)."""
        return {
            "hits": self.hits,
            "misses": self.misses,
            "evictions": self.evictions,
            "entries": len(self._entries),
            "bytes": self.bytes,
            "capacity_bytes": self.max_bytes,
            "returned": self.returned,
        }
