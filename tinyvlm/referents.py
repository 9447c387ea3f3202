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
# An object's attributes; what a question asks for when it names no object; and two relations: at
# the anchor of "the shape left of the red circle", the cell it points to; at the later of the two
# references of a left/right or above/below question, where the first object lies from the second.
COLUMNS = ("colour", "shape", "size", "cell", "count", "glyph", "pointed_cell", "across", "along")
CLASSES = {
    "colour": len(vocab.COLOURS),
    "shape": len(vocab.SHAPES),
    "size": len(vocab.SIZES),
    "cell": len(vocab.CELL_NAMES),
    "count": vocab.MAX_OBJECTS + 1,
    "glyph": len(vocab.GLYPHS),
    "pointed_cell": len(vocab.CELL_NAMES),
    "across": 3,  # left of, right of, same column
    "along": 3,  # above, below, same row
}
_CELLS = sorted(vocab.CELL_NAMES)


def _row(**values: int) -> list[int]:
    return [values.get(column, IGNORE) for column in COLUMNS]


def object_row(obj: Obj) -> list[int]:
    return _row(
        colour=list(vocab.COLOURS).index(obj.colour),
        shape=vocab.SHAPES.index(obj.shape),
        size=vocab.SIZES.index(obj.size),
        cell=_CELLS.index(obj.cell),
    )


def _side(a: int, b: int) -> int:
    return 0 if a < b else 1 if a > b else 2


def _relation_row(first: Obj, second: Obj) -> list[int]:
    """Where ``first`` lies from ``second``: columns (left/right/same), rows (above/below/same)."""
    return _row(across=_side(first.cell[0], second.cell[0]), along=_side(first.cell[1], second.cell[1]))


def _question_row(turn: Turn) -> list[int] | None:
    """What the end of a question that names no object should know: its object (a follow-up), its
    count, or its glyph."""
    if turn.about is not None:
        return object_row(turn.about)
    if turn.qtype == "count":
        return _row(count=int(turn.bare_answer))
    if turn.qtype == "presence":  # how many match, which says yes or no
        return _row(count=len(turn.counted))
    if turn.qtype == "text":
        return _row(glyph=vocab.GLYPHS.index(turn.bare_answer))
    return None


def token_ending_at(offsets: list[tuple[int, int]], end: int) -> int:
    """Index of the token whose characters end at ``end`` (or the last one that ends before it)."""
    best = 0
    for index, (_, stop) in enumerate(offsets):
        if stop <= end:
            best = index
    return best


def _mention_rows(turn: Turn) -> list[list[int]]:
    """One row per mention of ``turn``, in order: its object, plus the relations (COLUMNS)."""
    rows = [object_row(m.obj) for m in turn.mentions]
    if turn.about is not None and all(m.obj is not turn.about for m in turn.mentions):
        for row in rows:  # anchors of "the shape left of ...": the cell they point to
            row[COLUMNS.index("pointed_cell")] = _CELLS.index(turn.about.cell)
    if turn.qtype == "relative" and len(turn.mentions) == 2:
        first, second = turn.mentions
        relation = _relation_row(first.obj, second.obj)
        later = (
            rows[1]
            if turn.question.lower().rfind(second.text) > turn.question.lower().rfind(first.text)
            else rows[0]
        )
        for column in ("across", "along"):
            later[COLUMNS.index(column)] = relation[COLUMNS.index(column)]
    return rows


def targets(
    text: str, offsets: list[tuple[int, int]], turns: list[Turn]
) -> tuple[list[int], list[list[int]]]:
    """Token positions and their referent rows (``COLUMNS`` order, IGNORE where not asked) for a
    rendered conversation ``text`` and its tokens' character ``offsets``.

    Every mention is read at its last token. A question that names no object (a follow-up, a count,
    the text) is read at its last token. A question that names objects is not read at its end as
    well: that hurt, with perfect image features (colour of "the star" 99 -> 64 % at 400 steps;
    overall 81.5 -> 56.8 % when left/right questions read their object at the end, 62.2 % when
    questions about "the shape left of the red circle" did, at 1,000 steps)."""
    positions: list[int] = []
    rows: list[list[int]] = []
    cursor = 0
    for turn in turns:
        start = text.index(turn.question, cursor)
        cursor = start + len(turn.question)
        lowered = turn.question.lower()
        for mention, row in zip(turn.mentions, _mention_rows(turn), strict=True):
            at = lowered.rfind(mention.text)
            if at >= 0:
                positions.append(token_ending_at(offsets, start + at + len(mention.text)))
                rows.append(row)
        question = None if turn.mentions else _question_row(turn)
        if question is not None:
            positions.append(token_ending_at(offsets, cursor))
            rows.append(question)
    return positions, rows


class ReferentHead(nn.Module):
    """Linear read-out of the referent rows from a language-model layer's hidden states."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.sizes = [CLASSES[c] for c in COLUMNS]
        self.linear = nn.Linear(hidden, sum(self.sizes))

    def loss(self, hidden: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over every asked entry of ``rows`` (N, C); ``hidden``: (N, H).

        Per entry, not per column: a rare column (where two objects lie from each other) then
        weighs what it is asked, instead of as much as every object's colour."""
        if len(rows) == 0:
            return hidden.sum() * 0.0
        normed = F.layer_norm(hidden, hidden.shape[-1:])
        total, count = hidden.new_zeros(()), 0
        for column, logits in enumerate(torch.split(self.linear(normed), self.sizes, dim=-1)):
            asked = rows[:, column] != IGNORE
            if asked.any():
                total = total + F.cross_entropy(logits[asked], rows[asked, column], reduction="sum")
                count += int(asked.sum())
        return total / max(count, 1)


WINDOW_THETA = 0.01  # radians per token: cos(theta * delta) falls monotonically over 314 tokens


def recency_heads(model: Any, heads: tuple[int, ...], window: float) -> None:
    """Start ``heads`` of the first text layer as a window over the last ~``window`` tokens.

    A slow rotary pair (half a period longer than the context) with equal, large query and key
    biases scores a key ``delta`` tokens back as c * cos(theta * delta) ~ c - c * (theta * delta)^2 / 2:
    a Gaussian window on recency, here 2 nats down at ``window`` tokens. The pair's weights are
    zeroed so the window starts free of content; training may change all of it."""
    text = model.model.language_model
    config = model.config.text_config
    head_dim = config.hidden_size // config.num_attention_heads
    group = config.num_attention_heads // config.num_key_value_heads
    frequencies = text.rotary_emb.inv_freq
    pair = int((frequencies - WINDOW_THETA).abs().argmin())
    theta = float(frequencies[pair])
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
