"""Next-token choice per row: greedy (temperature 0) or temperature / top-k / top-p with a per-request
seeded generator, so a sampled answer does not depend on what else is in the batch."""

from __future__ import annotations

import torch

from services.engine.api import SamplingParams


def sample(
    logits: torch.Tensor, params: list[SamplingParams], gens: list[torch.Generator | None]
) -> list[int]:
    """``logits`` (B, V) fp32 -> one token id per row."""
    out = logits.argmax(dim=-1).tolist()
    for i, p in enumerate(params):
        if p.temperature > 0:
            out[i] = _sample_row(logits[i], p, gens[i])
    return out


def _sample_row(logits: torch.Tensor, p: SamplingParams, gen: torch.Generator | None) -> int:
    scores = logits.cpu() / p.temperature
    if 0 < p.top_k < scores.numel():
        kth = torch.topk(scores, p.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if not torch.isfinite(probs).all():
        raise ValueError("non-finite logits")
    if p.top_p < 1.0:
        sorted_p, idx = probs.sort(descending=True)
        # keep the smallest set whose mass reaches top_p (the first token always stays)
        drop = sorted_p.cumsum(0) - sorted_p > p.top_p
        probs = probs.scatter(0, idx[drop], 0.0)
        probs = probs / probs.sum()
    return int(torch.multinomial(probs, 1, generator=gen).item())


def make_generator(seed: int | None) -> torch.Generator:
    gen = torch.Generator()
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen
