"""Blocked batches: stretches of training steps whose batches all ask one kind of question.

    python -m tinyvlm.train --blocked

Inside the full question mix the language model does not learn, in the budget, the lookups that
rare question types need: given perfect image features (``tinyvlm.oracle``) it stayed at chance on
"what is written" after 2,400 steps, where text is 2.5 % of the answers. With ~200 steps whose 16
conversations all ask a text question (and the other answers weighted 0.2) it went from 0.8 to
99.2 %, and kept it through the steps that followed (figures in ``tinyvlm/README.md``).
"""

import random
from dataclasses import dataclass

import torch

from tinyvlm import data
from tinyvlm.questions import ATTRIBUTES


@dataclass(frozen=True)
class Block:
    """From ``start`` to ``end`` (shares of all steps), batches hold only conversations asking one of
    ``types``."""

    start: float
    end: float
    types: tuple[str, ...]


# The schedule measured with the oracle (text 0.8 -> 99.2 %); the rest of the steps keep the mix.
BLOCKS = (
    Block(0.12, 0.33, ("text",)),
    Block(0.33, 0.50, ("relative",)),
    Block(0.50, 0.65, ("count",)),
    Block(0.65, 0.85, ATTRIBUTES),
)
OFF_BLOCK_WEIGHT = 0.2  # the weight of a block batch's answers of other types


def block_at(step: int, steps: int, blocks: tuple[Block, ...]) -> Block | None:
    share = step / steps
    return next((b for b in blocks if b.start <= share < b.end), None)


def blocked_plan(
    plan: list[list[int]],
    types: list[list[str]],
    first: int,
    blocks: tuple[Block, ...],
    seed: int,
) -> list[list[int]]:
    """``plan`` with every step inside a block drawn from the conversations ``first + i`` whose
    turns ``types[i]`` ask one of the block's types (the step is kept when none does)."""
    rng = random.Random(seed)
    pools = {b: [first + i for i, t in enumerate(types) if set(t) & set(b.types)] for b in blocks}
    out = []
    for step, batch in enumerate(plan):
        block = block_at(step, len(plan), blocks)
        pool = [] if block is None else pools[block]
        out.append(rng.sample(pool, len(batch)) if len(pool) >= len(batch) else batch)
    return out


def answer_weights(
    labels: torch.Tensor, types: list[str], focus: tuple[str, ...], off: float
) -> torch.Tensor:
    """(L,) weights over one conversation's label positions: 1 on the answers of a ``focus`` type,
    ``off`` on other answers, 0 outside answers. ``types`` names each answer's type in order."""
    weights = torch.zeros(labels.shape, dtype=torch.float32)
    for (start, end), qtype in zip(data.answer_spans(labels), types, strict=True):
        weights[start:end] = 1.0 if qtype in focus else off
    return weights


def batch_weights(
    examples: list[data.Example], types: list[list[str]], focus: tuple[str, ...], length: int
) -> torch.Tensor:
    """(B, length) answer weights for a collated batch (right-padded with zeros)."""
    pairs = zip(examples, types, strict=True)
    rows = [answer_weights(e.labels, t, focus, OFF_BLOCK_WEIGHT) for e, t in pairs]
    return torch.stack([torch.nn.functional.pad(w, (0, length - len(w))) for w in rows])
