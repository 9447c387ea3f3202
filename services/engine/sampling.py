"""Next-token choice per row: greedy (temperature below ``GREEDY_BELOW``) or temperature / top-k / top-p
with a per-request seeded generator, so a sampled answer does not depend on what else is in the batch.

A row whose numbers are not finite (NaN or inf in the model's logits, or after temperature, top-k or
top-p) gets a ``NonFiniteLogits`` instead of a token: that sequence fails, the other rows are sampled
as if it were not there.

A row may ban tokens (``banned``: its EOS ids while it is short of ``min_tokens``): they get -inf after
the finiteness checks, so a ban is "never this token", not a fault. A row may also come with an
``allowed`` mask (structured output, ``grammar.py``): only those tokens (less its bans) can be picked,
greedy or sampled; a row left with no token at all gets a ``NoAllowedToken``.
"""

from __future__ import annotations

import torch

from services.engine.api import SamplingParams

# vLLM's _SAMPLING_EPS: dividing by a smaller temperature overflows fp32 (1e-320 gave inf logits)
GREEDY_BELOW = 1e-5


class NonFiniteLogits(ValueError):
    """One row's scores hold NaN or inf: a numerical fault of that sequence, never of the batch."""


class NoAllowedToken(ValueError):
    """A constrained row's grammar (less its bans) allows no token at all."""


Masks = list[torch.Tensor | None]


def is_greedy(p: SamplingParams) -> bool:
    return p.temperature < GREEDY_BELOW


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    gens: list[torch.Generator | None],
    banned: list[tuple[int, ...]] | None = None,
    allowed: Masks | None = None,
) -> list[int | ValueError]:
    """``logits`` (B, V) fp32 -> one token id per row, or the row's ``NonFiniteLogits`` /
    ``NoAllowedToken``. ``allowed``: per row, None (free) or a bool (V,) mask of the tokens it may take."""
    bans = banned or [()] * len(params)
    masks = [_with_ban(m, ban) for m, ban in zip(allowed or [None] * len(params), bans, strict=True)]
    finite = torch.isfinite(logits).all(dim=-1).tolist()  # the model's own numbers, before any ban or mask
    out: list[int | ValueError] = list(_restricted(logits, bans, masks).argmax(dim=-1).tolist())
    for i, p in enumerate(params):
        mask = masks[i]
        if not finite[i]:
            out[i] = NonFiniteLogits(f"non-finite logits from the model ({_what(logits[i])})")
        elif mask is not None and not bool(mask.any()):
            out[i] = NoAllowedToken("the response format's grammar allows no next token")
        elif not is_greedy(p):
            out[i] = _sample_row(logits[i], p, gens[i], bans[i], mask)
    return out


def _with_ban(mask: torch.Tensor | None, ban: tuple[int, ...]) -> torch.Tensor | None:
    if mask is None or not ban:
        return mask
    mask = mask.clone()
    mask[list(ban)] = False
    return mask


def _restricted(logits: torch.Tensor, bans: list[tuple[int, ...]], masks: Masks) -> torch.Tensor:
    """``logits`` with each row's banned or disallowed tokens at -inf (a copy; the same tensor when no
    row has any)."""
    if not any(bans) and all(m is None for m in masks):
        return logits
    out = logits.clone()
    for i, (ban, mask) in enumerate(zip(bans, masks, strict=True)):
        if ban:
            out[i, list(ban)] = float("-inf")
        if mask is not None:
            out[i].masked_fill_(~mask, float("-inf"))
    return out


def _sample_row(
    logits: torch.Tensor,
    p: SamplingParams,
    gen: torch.Generator | None,
    ban: tuple[int, ...] = (),
    allowed: torch.Tensor | None = None,
) -> int | NonFiniteLogits:
    scores = logits.cpu() / p.temperature
    if not torch.isfinite(scores).all():
        return NonFiniteLogits(f"non-finite scores after temperature {p.temperature:g} ({_what(scores)})")
    if ban:
        scores[list(ban)] = float("-inf")
    if allowed is not None:
        scores = scores.masked_fill(~allowed.cpu(), float("-inf"))  # -inf: "never", not a fault
    if 0 < p.top_k < scores.numel():
        kth = torch.topk(scores, p.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))  # -inf: "never", not a fault
    probs = torch.softmax(scores, dim=-1)
    if p.top_p < 1.0:
        sorted_p, idx = probs.sort(descending=True)
        # keep the smallest set whose mass reaches top_p (the first token always stays)
        drop = sorted_p.cumsum(0) - sorted_p > p.top_p
        probs = probs.scatter(0, idx[drop], 0.0)
        probs = probs / probs.sum()
    if not (torch.isfinite(probs).all() and probs.sum() > 0):
        return NonFiniteLogits("non-finite probabilities after top-k/top-p")
    return int(torch.multinomial(probs, 1, generator=gen).item())


def _what(row: torch.Tensor) -> str:
    kinds = [name for name, bad in (("NaN", row.isnan()), ("inf", row.isinf())) if bool(bad.any())]
    return " and ".join(kinds) or "none"


def make_generator(seed: int | None) -> torch.Generator:
    gen = torch.Generator()
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen
