"""The running batch's KV: one HF ``DynamicCache`` of shape (B, heads, L, head_dim) per layer, plus a
(B, L) mask of which columns hold real tokens for each row.

Rows are aligned on the right: every decode step appends one column to all rows, so a row's tokens
end at the last column. Rows that joined later or are shorter have masked (zero) columns on the
left; a row whose prefix came from a cache may also have a masked gap between prefix and suffix.
Positions are per row and explicit, so columns never stand for positions; the mask alone says
what attends to what. Membership changes (join, leave) copy the cache once; decode steps do not.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import DynamicCache

from services.engine.caches import KV


def pad_left(t: torch.Tensor, length: int) -> torch.Tensor:
    """(B, H, n, D) -> (B, H, length, D) with zero columns in front."""
    n = t.shape[-2]
    if n == length:
        return t
    out = t.new_zeros(*t.shape[:-2], length, t.shape[-1])
    out[..., length - n :, :] = t
    return out


def stack_left(parts: list[torch.Tensor], length: int) -> torch.Tensor:
    """Several (1, H, n_i, D) tensors -> (B, H, length, D), each right-aligned."""
    if all(t.shape[-2] == length for t in parts):  # e.g. every row reuses the same system prompt
        return torch.cat(parts)  # one op, not one a row: the values are the same
    first = parts[0]
    out = first.new_zeros(len(parts), first.shape[1], length, first.shape[-1])
    for i, t in enumerate(parts):
        n = t.shape[-2]
        if n:
            out[i, :, length - n :] = t[0]
    return out


CacheFactory = Callable[[list[tuple[torch.Tensor, torch.Tensor]]], DynamicCache]


class BatchKV:
    def __init__(self, make_cache: CacheFactory) -> None:
        self.make_cache = make_cache
        self.ids: list[str] = []
        self.cache: DynamicCache | None = None
        self.mask = torch.zeros(0, 0, dtype=torch.bool)
        self._padded = False  # any masked column in any row (changes only when rows join or leave)

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
        layers = [
            (
                torch.cat([pad_left(k1, length), pad_left(k2, length)]),
                torch.cat([pad_left(v1, length), pad_left(v2, length)]),
            )
            for (k1, v1), (k2, v2) in zip(self.layers(), other.layers(), strict=True)
        ]
        self.mask = torch.cat([_pad_mask(self.mask, length), _pad_mask(other.mask, length)])
        self._padded = not bool(self.mask.all())
        self.ids = self.ids + other.ids
        self.cache = self.make_cache(layers)

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
        dev = self.layers()[0][0].device
        layers = [
            (k.index_select(0, idx.to(dev))[:, :, first:], v.index_select(0, idx.to(dev))[:, :, first:])
            for k, v in self.layers()
        ]
        self.mask = mask[:, first:]
        self._padded = not bool(self.mask.all())
        self.cache = self.make_cache(layers)

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

    def decode_mask(self) -> torch.Tensor | None:
        """Attention mask for a one-token step: None when no row has padding (what an unpadded run
        uses), else the (B, 1, 1, L) boolean mask itself (skips rebuilding it from 2-D every step)."""
        return self.mask[:, None, None, :] if self._padded else None


def cache_layers(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per-layer (keys, values) of a full-attention DynamicCache."""
    return [(layer.keys, layer.values) for layer in cache.layers]  # type: ignore[union-attr,misc]


def _pad_mask(mask: torch.Tensor, length: int) -> torch.Tensor:
    return torch.cat([torch.zeros(mask.shape[0], length - mask.shape[1], dtype=torch.bool), mask], dim=1)
