"""Referent labels: what each referring expression of a question names, for a training-only loss.

From scratch, a small language model stalls at "answer with some object's colour": to answer
"What colour is the star?" it must carry "star" to the answer position and then look the star up
among the image tokens, and neither hop pays off before the other exists. Two training aids break
that stall (``tinyvlm/README.md`` has the figures):

- a linear head reads, at the last token of every reference ("the red circle", "the shape on the
  left"), the attributes of the object it names, and at the last token of every question the object
  the answer is about (also for follow-ups: "And its colour?"), the count asked for, or the glyph;
  so the lookup is learnt where the words are, one hop at a time;
- a few heads of the first layer start as a window over the last tokens (``recency_heads``), so the
  answer position reads the end of the question from the first step.

Both leave the saved model a plain Glm4v: the head exists only during training and the window is an
initialisation of the attention's own query/key biases.
"""

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tinyvlm import vocab
from tinyvlm.questions import Turn
from tinyvlm.scene import Obj

IGNORE = -100
COLUMNS = ("colour", "shape", "size", "cell", "count", "glyph", "other_cell")
CLASSES = {
    "colour": len(vocab.COLOURS),
    "shape": len(vocab.SHAPES),
    "size": len(vocab.SIZES),
    "cell": len(vocab.CELL_NAMES),
    "count": vocab.MAX_OBJECTS + 1,
    "glyph": len(vocab.GLYPHS),
    "other_cell": len(vocab.CELL_NAMES),
}
_CELLS = sorted(vocab.CELL_NAMES)


def object_row(obj: Obj) -> list[int]:
    return [
        list(vocab.COLOURS).index(obj.colour),
        vocab.SHAPES.index(obj.shape),
        vocab.SIZES.index(obj.size),
        _CELLS.index(obj.cell),
        IGNORE,
        IGNORE,
        IGNORE,
    ]


def _question_row(turn: Turn) -> list[int] | None:
    """What the end of a question should know: its object (and the one it is compared with), its
    count, or its glyph."""
    if turn.about is not None:
        row = object_row(turn.about)
        if turn.other is not None:
            row[COLUMNS.index("other_cell")] = _CELLS.index(turn.other.cell)
        return row
    blank = [IGNORE] * len(COLUMNS)
    if turn.qtype == "count":
        blank[COLUMNS.index("count")] = int(turn.answer)
        return blank
    if turn.qtype == "text":
        blank[COLUMNS.index("glyph")] = vocab.GLYPHS.index(turn.answer)
        return blank
    return None


def _named_outright(turn: Turn) -> bool:
    """The question's object is one of its plain references and nothing else is asked (supervising
    the question's end as well then hurt: colour of "the star" 99 % -> 64 % at 400 steps)."""
    return turn.other is None and any(m.obj is turn.about for m in turn.mentions)


def _token_ending_at(offsets: list[tuple[int, int]], end: int) -> int:
    """Index of the token whose characters end at ``end`` (or the last one that ends before it)."""
    best = 0
    for index, (_, stop) in enumerate(offsets):
        if stop <= end:
            best = index
    return best


def targets(
    text: str, offsets: list[tuple[int, int]], turns: list[Turn], question_ends: str = "unmentioned"
) -> tuple[list[int], list[list[int]]]:
    """Token positions and their referent rows (``COLUMNS`` order, IGNORE where not asked) for a
    rendered conversation ``text`` and its tokens' character ``offsets``."""
    positions: list[int] = []
    rows: list[list[int]] = []
    cursor = 0
    for turn in turns:
        start = text.index(turn.question, cursor)
        cursor = start + len(turn.question)
        lowered = turn.question.lower()
        for mention in turn.mentions:
            at = lowered.rfind(mention.text)
            if at >= 0:
                positions.append(_token_ending_at(offsets, start + at + len(mention.text)))
                rows.append(object_row(mention.obj))
        ask_end = question_ends == "all" or (question_ends == "unmentioned" and not _named_outright(turn))
        question = _question_row(turn) if ask_end else None
        if question is not None:
            positions.append(_token_ending_at(offsets, cursor))
            rows.append(question)
    return positions, rows


class ReferentHead(nn.Module):
    """Linear read-out of the referent rows from a language-model layer's hidden states."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.sizes = [CLASSES[c] for c in COLUMNS]
        self.linear = nn.Linear(hidden, sum(self.sizes))

    def loss(self, hidden: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over the asked columns of ``rows`` (N, C); ``hidden``: (N, H)."""
        if len(rows) == 0:
            return hidden.sum() * 0.0
        normed = F.layer_norm(hidden, hidden.shape[-1:])
        terms = []
        for column, logits in enumerate(torch.split(self.linear(normed), self.sizes, dim=-1)):
            asked = rows[:, column] != IGNORE
            if asked.any():
                terms.append(F.cross_entropy(logits[asked], rows[asked, column]))
        return torch.stack(terms).mean()


def recency_heads(model: Any, heads: tuple[int, ...], window: float, pair: int = 4) -> None:
    """Start ``heads`` of the first text layer as a window over the last ~``window`` tokens.

    A slow rotary pair (period > the context) with equal, large query and key biases scores a key
    ``delta`` tokens back as c * cos(theta * delta) ~ c - c * (theta * delta)^2 / 2: a Gaussian
    window on recency, here 2 nats down at ``window`` tokens. The pair's weights are zeroed so the
    window starts free of content; training may change all of it."""
    text = model.model.language_model
    config = model.config.text_config
    head_dim = config.hidden_size // config.num_attention_heads
    group = config.num_attention_heads // config.num_key_value_heads
    theta = float(text.rotary_emb.inv_freq[pair])
    scale = 4.0 / (theta**2 * window**2)  # c: the score drop at `window` is c*(theta*window)^2/2 = 2
    amplitude = (scale * head_dim**0.5) ** 0.5  # q.k is divided by sqrt(head_dim)
    attention = text.layers[0].self_attn
    with torch.no_grad():
        for head in heads:
            q_dim, k_dim = head * head_dim + 2 * pair, (head // group) * head_dim + 2 * pair
            attention.q_proj.weight[q_dim : q_dim + 2] = 0
            attention.k_proj.weight[k_dim : k_dim + 2] = 0
            attention.q_proj.bias[q_dim : q_dim + 2] = torch.tensor([amplitude, 0.0])
            attention.k_proj.bias[k_dim : k_dim + 2] = torch.tensor([amplitude, 0.0])
