"""Model runner: turns scheduled sequences into logits. Owns the running batch's KV and the caches.

- ``prefill(seqs)``: for each new sequence, reuse the longest cached KV prefix (prefix or session
  cache), get image features for images in the uncached suffix (image cache or one batched vision
  call), then one forward over all suffixes (left-padded) on top of their cached prefixes; the new
  rows join the running batch. Given running rows to step (``stepping``), the same forward takes
  their next token too where their padding is small (``_mixes``; the others are parked, as in
  ``decode``).
- ``decode(seqs)``: one forward of one token per given running row, per-row positions; running rows
  not given are parked (kept, not stepped: batch work pauses while interactive work runs).
- ``release(seqs)``: rows leave the batch at once; a finished turn's KV goes to the session cache.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from services.engine.api import ImageInput
from services.engine.architectures import Architecture
from services.engine.caches import KV, ImageCache, KVEntry, PrefixCache, SessionCache
from services.engine.kv import BatchKV, cache_layers, stack_left
from services.engine.kv_layer import HEADROOM
from services.engine.sequence import Prompt, Sequence
from services.engine.vision import VisionPrefetcher


@dataclass
class Caches:
    prefix: PrefixCache | None
    session: SessionCache | None
    image: ImageCache | None

    def all(self) -> list[PrefixCache | SessionCache | ImageCache]:
        return [c for c in (self.prefix, self.session, self.image) if c is not None]


class ModelRunner:
    def __init__(
        self,
        arch: Architecture,
        caches: Caches,
        prefetcher: VisionPrefetcher | None = None,
        mix_padding_tokens: int = 0,
    ) -> None:
        self.arch = arch
        self.mix_padding_tokens = mix_padding_tokens  # see ``EngineConfig``
        self.caches = caches
        self.prefetcher = prefetcher
        self.batch = BatchKV(arch.make_cache)  # the running rows each decode steps
        self.parked = BatchKV(arch.make_cache)  # running rows not stepped now (paused batch work)

    # --- prefill ----------------------------------------------------------------------------------
    def prefill(
        self, seqs: list[Sequence], stepping: list[Sequence] | None = None
    ) -> tuple[list[Sequence], torch.Tensor]:
        """Logits of each prompt's last token; the sequences join the batch. ``stepping``: running
        sequences that may take their next token in the same forward (``_mixes``): their one new
        token is padded on the left to the prompts' width. Returns (rows, logits (rows, V)): the
        stepped sequences in batch order (none where the padding would cost too much), then ``seqs``."""
        reused = [self._reuse(s) for s in seqs]
        t0 = time.perf_counter()
        feats = self._image_features(seqs)
        t1 = time.perf_counter()
        width = max(s.num_prompt_tokens - s.num_cached_tokens for s in seqs)
        cached = max(s.num_cached_tokens for s in seqs)
        stepped = self._stepped_rows(stepping) if stepping and self._mixes(stepping, width, cached) else []
        cached = max(cached, self.batch.length) if stepped else cached
        embeds = torch.stack([self._suffix_embeds(s, feats, width) for s in seqs])
        positions = torch.stack(
            [self._suffix_positions(s.prompt, s.num_cached_tokens, width) for s in seqs], -2
        )
        mask = torch.stack([self._row_mask(s, cached, width) for s in seqs])
        if stepped:
            embeds, positions, mask = self._with_steps(stepped, width, cached, embeds, positions, mask)
        cache = self._prefix_cache(reused, cached, width, lead=self.batch.layers() if stepped else None)
        logits = self.arch.forward(embeds, mask, positions, cache)
        new = BatchKV.of(self.arch.make_cache, [s.id for s in stepped + seqs], cache, mask)
        if stepped:
            self.batch = new  # the stepped rows' KV was copied into the new cache, with the new rows'
        else:
            self.batch.merge(new)
        t2 = time.perf_counter()
        for s in seqs:
            s.vision_s, s.prefill_s = t1 - t0, t2 - t1
        return stepped + seqs, logits

    def _mixes(self, stepping: list[Sequence], width: int, cached: int) -> bool:
        """Step the running rows in the prefill's forward while their padding (``width - 1`` columns
        a row) stays within ``mix_padding_tokens``: one forward instead of a prefill that stalls them
        and a decode step of their own after it. The padding stays in their KV as masked columns until
        they leave, so not once any of them would carry more than twice that many: a long answer
        with many joiners falls back to plain prefills instead of attending over growing gaps."""
        if len(stepping) * (width - 1) > self.mix_padding_tokens:
            return False
        length = max(self.batch.length, cached) + width
        shortest = min(s.num_prompt_tokens + len(s.output_ids) for s in stepping)  # its real columns after
        return length - shortest <= 2 * self.mix_padding_tokens

    def _stepped_rows(self, stepping: list[Sequence]) -> list[Sequence]:
        """The running rows to step, in batch order (others parked, as ``decode`` does)."""
        self._park_all_but({s.id for s in stepping})
        by_id = {s.id: s for s in stepping}
        rows = [by_id[rid] for rid in self.batch.ids]
        assert len(rows) == len(stepping), "a prefill may step running sequences only"
        return rows

    def _with_steps(
        self,
        rows: list[Sequence],
        width: int,
        length: int,
        embeds: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The running rows' next tokens in front of the prompts' rows: each its last sampled token
        right-aligned in ``width`` columns after its KV (``length`` columns), the rest padding."""
        tokens = self.arch.embed(torch.tensor([s.output_ids[-1] for s in rows]))[:, None]
        pad = tokens.new_zeros(len(rows), width - 1, tokens.shape[-1])
        at = torch.tensor([s.last_position for s in rows])[:, None]
        pos = torch.cat([at.new_zeros(len(rows), width - 1), at], dim=-1)
        pos = pos.expand(3, -1, -1) if positions.ndim == 3 else pos
        step_mask = self.batch.stepped_mask(length, width)
        return (
            torch.cat([torch.cat([pad, tokens], dim=1), embeds]),
            torch.cat([pos, positions], dim=-2),
            torch.cat([step_mask, mask]),
        )

    def _reuse(self, seq: Sequence) -> KV | None:
        """The longest cached KV prefix of this prompt (session or system prompt), sliced to length.
        Notes on ``seq`` the prefix-cache part of it, which its session entry will share."""
        seq.num_cached_tokens, seq.shared_kv = 0, None
        if not seq.request.use_cache:
            return None
        session: tuple[KVEntry | None, int] = (None, 0)
        if self.caches.session is not None and seq.request.session_id is not None:
            session = self.caches.session.match(seq.request.session_id, seq.prompt)
        prefix: tuple[KVEntry | None, int] = (None, 0)
        if self.caches.prefix is not None:
            prefix = self.caches.prefix.match(seq.prompt)
        entry, m = prefix if prefix[1] > session[1] else session
        if entry is None or m == 0:
            return None
        seq.num_cached_tokens = m
        if entry is prefix[0]:
            seq.shared_kv = entry.head(m)  # views of the prefix entry
        elif entry.shared:
            seq.shared_kv = entry.head(min(m, entry.shared_len))  # the session's views of one
        return entry.head(m)

    def _prefix_cache(
        self, reused: list[KV | None], cached: int, suffix: int, lead: KV | None = None
    ) -> DynamicCache:
        """The rows' cached prefixes (after ``lead``, the stepped running rows' KV), in buffers with
        room for the suffix (the forward appends it in place) and for decode steps after it."""
        if not cached:
            return self.arch.make_cache(None)
        return self.arch.make_cache(self._stack_prefixes(reused, cached, suffix, lead), cached)

    @staticmethod
    def _stack_prefixes(
        reused: list[KV | None], length: int, suffix: int, lead: KV | None
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        ref = lead or next(kv for kv in reused if kv)
        empty = [(k[:1, :, :0], v[:1, :, :0]) for k, v in ref]
        rows = ([lead] if lead else []) + [kv or empty for kv in reused]
        spare = suffix + HEADROOM
        stacked = [
            [stack_left([r[i][kv] for r in rows], length, spare) for kv in (0, 1)] for i in range(len(ref))
        ]
        return [(k, v) for k, v in stacked]

    def _image_features(self, seqs: list[Sequence]) -> dict[str, torch.Tensor]:
        """Features by digest for every image that lies (partly) in an uncached suffix: from the image
        cache, else computed ahead by the prefetcher, else one batched vision call now."""
        feats: dict[str, torch.Tensor] = {}
        todo: dict[str, tuple[ImageInput, bool]] = {}
        for s in seqs:
            if self.prefetcher is not None:
                self.prefetcher.claim(s)
            use_cache = s.request.use_cache and self.caches.image is not None
            for span in s.prompt.spans:
                if span.end <= s.num_cached_tokens or span.digest in feats or span.digest in todo:
                    continue
                hit = self.caches.image.get(span.digest) if use_cache and self.caches.image else None
                ahead = s.features.get(span.digest)
                if hit is not None:
                    feats[span.digest] = hit
                elif ahead is not None:
                    feats[span.digest] = ahead
                    self._cache_image(span.digest, ahead, use_cache)
                else:
                    todo[span.digest] = (s.request.images[span.index], use_cache)
            s.features = {}  # used (or not needed): free them
        if todo:
            computed = self.arch.encode_images([img for img, _ in todo.values()])
            for (digest, (_, use_cache)), f in zip(todo.items(), computed, strict=True):
                feats[digest] = f
                self._cache_image(digest, f, use_cache)
        return feats

    def _cache_image(self, digest: str, features: torch.Tensor, use_cache: bool) -> None:
        if use_cache and self.caches.image is not None:
            self.caches.image.put(digest, features.clone())

    def _suffix_embeds(self, seq: Sequence, feats: dict[str, torch.Tensor], width: int) -> torch.Tensor:
        m = seq.num_cached_tokens
        ids = torch.tensor(seq.prompt.token_ids[m:])
        emb = self.arch.embed(ids).clone()
        for span in seq.prompt.spans:
            if span.end > m:
                start = max(span.start, m)
                emb[start - m : span.end - m] = feats[span.digest][start - span.start :]
        pad = emb.new_zeros(width - emb.shape[0], emb.shape[1])
        return torch.cat([pad, emb])

    @staticmethod
    def _suffix_positions(prompt: Prompt, m: int, width: int) -> torch.Tensor:
        pos = prompt.positions[..., m:]
        pad = pos.new_zeros(*pos.shape[:-1], width - pos.shape[-1])
        return torch.cat([pad, pos], dim=-1)

    @staticmethod
    def _row_mask(seq: Sequence, cached: int, suffix: int) -> torch.Tensor:
        m, n = seq.num_cached_tokens, seq.num_prompt_tokens - seq.num_cached_tokens
        mask = torch.zeros(cached + suffix, dtype=torch.bool)
        mask[cached - m : cached] = True
        mask[cached + suffix - n :] = True
        return mask

    # --- decode -----------------------------------------------------------------------------------
    def decode(self, seqs: list[Sequence]) -> tuple[list[Sequence], torch.Tensor]:
        """Next-token logits for these running sequences: (rows in batch order, logits (B, V)). Rows
        of the running batch left out are parked (their KV kept aside, not stepped) until a later
        decode names them again."""
        self._park_all_but({s.id for s in seqs})
        by_id = {s.id: s for s in seqs}
        rows = [by_id[rid] for rid in self.batch.ids]
        assert len(rows) == len(seqs), "decode must cover running sequences only"
        step = torch.tensor([[s.output_ids[-1] for s in rows], [s.last_position for s in rows]]).unsqueeze(-1)
        pos = step[1].expand(3, -1, -1) if self.arch.grid else step[1]
        self.batch.append_column()
        assert self.batch.cache is not None
        logits = self.arch.forward(self.arch.embed(step[0]), self.batch.decode_mask(), pos, self.batch.cache)
        return rows, logits

    def _park_all_but(self, ids: set[str]) -> None:
        """Rows not in ``ids`` leave the stepped batch for the parked one; parked rows in it return."""
        if set(self.batch.ids) == ids:
            return
        leaving = set(self.batch.ids) - ids
        returning = ids & set(self.parked.ids)
        if leaving:
            self.parked.merge(self.batch.take(leaving))
        if returning:
            self.batch.merge(self.parked.take(returning))

    # --- leaving ----------------------------------------------------------------------------------
    def release(self, seqs: list[Sequence], save_session: list[bool]) -> None:
        if not seqs:  # called after every step, mostly with nobody leaving
            return
        for seq, save in zip(seqs, save_session, strict=True):
            holder = self.parked if seq.id in self.parked.ids else self.batch
            if save and self.caches.session is not None and seq.request.session_id and seq.id in holder.ids:
                self.caches.session.put(seq.request.session_id, self._session_entry(seq, holder))
        self.batch.remove({s.id for s in seqs})
        self.parked.remove({s.id for s in seqs})

    @staticmethod
    def _session_entry(seq: Sequence, holder: BatchKV) -> KVEntry:
        """The turn's KV: the prefix-cache part shared (views, no copy), the rest copied out of the batch."""
        tokens = seq.fed_ids
        shared = seq.shared_kv or None
        own = holder.extract(seq.id, len(tokens) - (shared[0][0].shape[-2] if shared else 0))
        return KVEntry(tuple(tokens), tuple(seq.prompt.spans), own, shared)

    def reset(self, keep_parked: bool = False) -> None:
        """Drop the running batch's KV (and the parked rows' unless ``keep_parked``: a failed decode
        step never touched them)."""
        self.batch = BatchKV(self.arch.make_cache)
        if not keep_parked:
            self.parked = BatchKV(self.arch.make_cache)

    # --- prefix cache -----------------------------------------------------------------------------
    def compute_prefix(self, prompt: Prompt) -> KVEntry:
        """KV of a text-only token prefix, computed alone (batch of one, no padding)."""
        ids = torch.tensor(prompt.token_ids)
        cache = self.arch.make_cache(None)
        mask = torch.ones(1, len(ids), dtype=torch.bool)
        self.arch.forward(self.arch.embed(ids)[None], mask, prompt.positions.unsqueeze(-2), cache)
        owned = [(k.contiguous(), v.contiguous()) for k, v in cache_layers(cache)]  # not the buffer's spare
        return KVEntry(tuple(prompt.token_ids), (), owned)
