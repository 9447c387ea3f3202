"""The running batch's KV: one HF ``DynamicCache`` of shape (B, heads, L, head_dim) per layer, plus a
(B, L) mask of which columns hold real tokens for each row.

Rows are aligned on the right: every decode step appends one column to all rows, so a row's tokens
end at the last column. Rows that joined later or are shorter have masked (zero) columns on the
left; a row whose prefix came from a cache may also have a masked gap between prefix and suffix,
and a row stepped inside a prefill's forward (``ModelRunner.prefill``) one before that step's token
(holding the padding positions' KV: masked, never read).
Positions are per row and explicit, so columns never stand for positions; the mask alone says
what attends to what. Membership changes (join, leave) copy the cache once, into buffers with spare
columns; decode steps write into those and copy nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import DynamicCache

from services.engine.caches import KV
from services.engine.kv_layer import HEADROOM, spare_buffer


def stack_left(parts: list[torch.Tensor], length: int, spare: int = 0) -> torch.Tensor:
    """Tensors of (b_i, H, n_i, D) -> one (sum of b_i, H, length + spare, D) buffer: each part's rows
    right-aligned in the first ``length`` columns, zeros in front (masked columns must hold finite
    values); the ``spare`` columns after them are left uninitialised (for ``GrowingLayer.adopt``)."""
    out = spare_buffer(parts[0], sum(p.shape[0] for p in parts), length, spare)
    filled = out[..., :length, :]
    if all(p.shape[-2] == length for p in parts):  # e.g. every row reuses the same system prompt
        torch.cat(parts, out=filled)  # one op, not one a part
        return out
    row = 0
    for part in parts:
        rows, n = filled[row : row + part.shape[0]], part.shape[-2]
        if n < length:
            rows[..., : length - n, :].zero_()
        if n:
            rows[..., length - n :, :].copy_(part)
        row += part.shape[0]
    return out


# (layers, filled): ``filled`` None: the layers' tensors as they are; else buffers made for the cache,
# their first ``filled`` columns holding the KV (``Architecture.make_cache``)
CacheFactory = Callable[[list[tuple[torch.Tensor, torch.Tensor]], "int | None"], DynamicCache]


class BatchKV:
    def __init__(self, make_cache: CacheFactory) -> None:
        self.make_cache = make_cache
        self.ids: list[str] = []
        self.cache: DynamicCache | None = None
        self.mask = torch.zeros(0, 0, dtype=torch.bool)
        self._padded = False  # any masked column in any row (changes only when rows join or leave)

    @classmethod
    def of(cls, make_cache: CacheFactory, ids: list[str], cache: DynamicCache, mask: torch.Tensor) -> BatchKV:
        """A batch of these rows, ``cache`` holding their KV and ``mask`` its real columns."""
        batch = cls(make_cache)
        batch.ids, batch.cache, batch.mask = ids, cache, mask
        batch._padded = not bool(mask.all())
        return batch

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def length(self) -> int:
        return self.mask.shape[1]

    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        assert self.cache is not None
        return cache_layers(self.cache)

    def merge(self, other: BatchKV) -> None:
        """Append ``other``'s rows below ours (both padded on the left to a common length)."""
        if not self.ids:
            self.ids, self.cache, self.mask = other.ids, other.cache, other.mask
            self._padded = not bool(self.mask.all())
            return
        length = max(self.length, other.length)
        layers = [  # with spare columns: the next decode steps append without copying the cache again
            (stack_left([k1, k2], length, HEADROOM), stack_left([v1, v2], length, HEADROOM))
            for (k1, v1), (k2, v2) in zip(self.layers(), other.layers(), strict=True)
        ]
        self.mask = torch.cat([_pad_mask(self.mask, length), _pad_mask(other.mask, length)])
        self._padded = not bool(self.mask.all())
        self.ids = self.ids + other.ids
        self.cache = self.make_cache(layers, length)

    def remove(self, ids: set[str]) -> None:
        """Drop rows, then columns no remaining row uses (leading padding)."""
        keep = [i for i, rid in enumerate(self.ids) if rid not in ids]
        if len(keep) == len(self.ids):
            return
        self._keep_rows(keep)

    def take(self, ids: set[str]) -> BatchKV:
        """Move rows out: a new batch holding them (in this batch's order); this one keeps the rest."""
        taken = BatchKV(self.make_cache)
        rows = [i for i, rid in enumerate(self.ids) if rid in ids]
        if rows:
            taken.ids, taken.cache, taken.mask = list(self.ids), self.cache, self.mask
            taken._keep_rows(rows)
            self.remove(ids)
        return taken

    def _keep_rows(self, keep: list[int]) -> None:
        """Only these rows, without the leading columns none of them uses (copies the cache once)."""
        self.ids = [self.ids[i] for i in keep]
        if not keep:
            self.cache, self.mask = None, torch.zeros(0, 0, dtype=torch.bool)
            return
        idx = torch.tensor(keep)
        mask = self.mask[idx]
        first = int(mask.any(0).nonzero()[0])
        idx = idx.to(self.layers()[0][0].device)
        length = self.length - first
        layers = [(_select_rows(k, idx, first), _select_rows(v, idx, first)) for k, v in self.layers()]
        self.mask = mask[:, first:]
        self._padded = not bool(self.mask.all())
        self.cache = self.make_cache(layers, length)

    def extract(self, rid: str, n_tokens: int) -> KV:
        """One row's KV without padding: its last ``n_tokens`` real columns, as owned tensors."""
        row = self.ids.index(rid)
        cols = (
            self.mask[row].nonzero().flatten()[-n_tokens:] if n_tokens else torch.zeros(0, dtype=torch.long)
        )
        out: KV = []
        for k, v in self.layers():
            c = cols.to(k.device)
            out.append((k[row : row + 1].index_select(2, c), v[row : row + 1].index_select(2, c)))
        return out

    def append_column(self) -> None:
        """Before a decode step: every row gets one more real column."""
        self.mask = torch.cat([self.mask, torch.ones(len(self.ids), 1, dtype=torch.bool)], dim=1)

    def stepped_mask(self, length: int, width: int) -> torch.Tensor:
        """The rows' mask padded on the left to ``length`` columns, then ``width`` more of which only
        the last is real: a step's token among a prefill's ``width`` columns."""
        step = torch.zeros(len(self.ids), width, dtype=torch.bool)
        step[:, -1] = True
        return torch.cat([_pad_mask(self.mask, length), step], dim=1)

    def decode_mask(self) -> torch.Tensor | None:
        """Attention mask for a one-token step: None when no row has padding (what an unpadded run
        uses), else the (B, 1, 1, L) boolean mask itself (skips rebuilding it from 2-D every step)."""
        return self.mask[:, None, None, :] if self._padded else None


def cache_layers(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per-layer (keys, values) of a full-attention DynamicCache."""
    return [(layer.keys, layer.values) for layer in cache.layers]  # type: ignore[union-attr,misc]


def _select_rows(t: torch.Tensor, rows: torch.Tensor, first: int) -> torch.Tensor:
    """Rows ``rows`` from column ``first`` on, written into a buffer with spare columns."""
    out = spare_buffer(t, len(rows), t.shape[-2] - first)
    torch.index_select(t[:, :, first:], 0, rows, out=out[..., : t.shape[-2] - first, :])
    return out


def _pad_mask(mask: torch.Tensor, length: int) -> torch.Tensor:
    return torch.cat([torch.zeros(mask.shape[0], length - mask.shape[1], dtype=torch.bool), mask], dim=1)
