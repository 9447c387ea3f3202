"""A KV cache layer that appends into spare columns instead of concatenating.

HF's ``DynamicLayer.update`` runs ``torch.cat([keys, new], -2)``: every decode step copies the whole
cache of every layer into fresh memory. On the bundled model at 8 rows that was 41 % of a decode
step's CPU, most of it first-touch page faults of the new allocations, not the copy. Here the layer
keeps a buffer with ``HEADROOM`` spare columns and writes new tokens into it; ``keys``/``values``
are views of the filled part, so readers see exactly what a concatenation would give (same values,
same shape), and a step copies only its own new columns. The buffer is reallocated (one copy)
when it is full or when ``keys`` was replaced from outside (``make_cache`` given tensors, crop).
Whoever builds a new cache from old rows (a prefill on cached prefixes, rows joining or leaving the
batch) writes them into a ``spare_buffer`` the layer ``adopt``s: its next steps append in place
instead of copying the cache again.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

HEADROOM = 64  # spare columns per reallocation: a decode step copies the cache once per 64 steps


class GrowingLayer(DynamicLayer):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None
        self._filled = 0  # columns of the buffer that ``keys`` shows after the last update

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        assert self.keys is not None and self.values is not None
        filled = self.keys.shape[-2] if self.keys.numel() else 0
        new = key_states.shape[-2]
        if not self._fits(filled + new, key_states):
            self._key_buffer = _grown(self.keys, filled, key_states)
            self._value_buffer = _grown(self.values, filled, value_states)
        assert self._key_buffer is not None and self._value_buffer is not None
        self._key_buffer[..., filled : filled + new, :].copy_(key_states)
        self._value_buffer[..., filled : filled + new, :].copy_(value_states)
        self.keys = self._key_buffer[..., : filled + new, :]
        self.values = self._value_buffer[..., : filled + new, :]
        self._filled = filled + new
        return self.keys, self.values

    def adopt(self, key_buffer: torch.Tensor, value_buffer: torch.Tensor, filled: int) -> None:
        """Own these buffers, whose first ``filled`` columns hold the KV (the rest is spare): the next
        updates write into them without a copy. For buffers made for this layer (``spare_buffer``),
        never for tensors others still read (a cache entry's, whose later columns are not spare)."""
        self.lazy_initialization(key_buffer, value_buffer)
        self._key_buffer, self._value_buffer = key_buffer, value_buffer
        self.keys = key_buffer[..., :filled, :]
        self.values = value_buffer[..., :filled, :]
        self._filled = filled

    def _fits(self, length: int, key_states: torch.Tensor) -> bool:
        """The buffer holds ``length`` columns and ``keys`` is still its filled part (not replaced)."""
        buf, keys = self._key_buffer, self.keys
        if buf is None or keys is None or buf.shape[-2] < length:
            return False
        if keys.numel() == 0:  # nothing filled: a buffer of another shape is useless
            return buf.shape[:-2] == key_states.shape[:-2] and buf.shape[-1] == key_states.shape[-1]
        same_view = keys.data_ptr() == buf.data_ptr() and keys.stride() == buf.stride()
        return same_view and keys.shape[:-2] == buf.shape[:-2] and keys.shape[-2] == self._filled


def spare_buffer(like: torch.Tensor, rows: int, filled: int, spare: int = HEADROOM) -> torch.Tensor:
    """An uninitialised (rows, heads, filled + spare, head_dim) buffer like ``like``, for ``adopt``."""
    return like.new_empty(rows, like.shape[1], filled + spare, like.shape[-1])


def _grown(old: torch.Tensor, filled: int, new: torch.Tensor) -> torch.Tensor:
    """A buffer for ``filled`` old columns, ``new``'s columns and ``HEADROOM`` more; the old ones copied."""
    shape = (*new.shape[:-2], filled + new.shape[-2] + HEADROOM, new.shape[-1])
    buf = torch.empty(shape, dtype=new.dtype, device=new.device)
    if filled:
        buf[..., :filled, :].copy_(old)
    return buf
