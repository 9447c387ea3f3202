"""Pointer targets: which image token an attention head should look at, for a training-only loss.

From scratch, a small language model is slow to learn lookups ("What colour is the star?": find the
star's image token, read its colour): a head's query and key weights start small and each only gets
a gradient once the other is right. Telling one head per layer where to look breaks that stall:

- layer ``MENTION_LAYER``, head 0, at the last token of every reference ("the red circle", "the
  shape on the left") looks at the object it names; at the end of a text question, at the glyph; at
  the end of a count question, evenly at the objects counted and at the image's start token (so the
  share left on it tells how many there are, and zero matches has somewhere to look);
- layer ``ANSWER_LAYER``, head 0, at each ``<|assistant|>`` token (where the answer is predicted)
  looks at what the answer is about: the object of an attribute question or follow-up, the glyph,
  or the counted objects; a left/right or above/below question compares two objects, so head 0
  looks at the one asked about and head 1 at the other.

Targets are distributions over the image's start token (slot 0) and its image tokens (slots 1..G,
one per grid cell). The saved model is a plain Glm4v: only the loss knows about pointers.
"""

from dataclasses import dataclass

from tinyvlm import labels
from tinyvlm.questions import Turn
from tinyvlm.referents import token_ending_at
from tinyvlm.scene import Obj, Scene

MENTION_LAYER = 1
ANSWER_LAYER = 3
ASSISTANT = "<|assistant|>"


@dataclass(frozen=True)
class Pointer:
    position: int  # the query token
    layer: int
    head: int
    slots: tuple[int, ...]  # looked at evenly; 0 is the image's start token, k > 0 image token k - 1


class _Slots:
    """Image-token slots of a scene's objects and glyph on a ``grid_h`` x ``grid_w`` token grid."""

    def __init__(self, scene: Scene, grid_h: int, grid_w: int) -> None:
        self.scene, self.grid_h, self.grid_w = scene, grid_h, grid_w

    def object(self, obj: Obj) -> int:
        return 1 + labels.object_token(obj, self.scene, self.grid_h, self.grid_w)

    def glyph(self) -> int:
        return 1 + labels.glyph_token(self.scene, self.grid_h, self.grid_w)

    def counted(self, objs: tuple[Obj, ...]) -> tuple[int, ...]:
        return (0, *sorted(self.object(o) for o in objs))


def _question_end(turn: Turn, slots: _Slots) -> tuple[int, ...] | None:
    """What the end of a question that names no object looks at (text, count), if anything."""
    if turn.qtype == "text":
        return (slots.glyph(),)
    if turn.qtype in ("count", "presence"):
        return slots.counted(turn.counted)
    return None


def _answer(turn: Turn, slots: _Slots) -> list[tuple[int, ...]]:
    """What each answer head looks at (head 0 first), as slots."""
    if turn.qtype == "relative":
        return [(slots.object(mention.obj),) for mention in turn.mentions]  # the object asked about first
    if turn.about is not None:
        return [(slots.object(turn.about),)]
    question = _question_end(turn, slots)
    return [] if question is None else [question]


def pointers(
    text: str, offsets: list[tuple[int, int]], turns: list[Turn], scene: Scene, grid_h: int, grid_w: int
) -> list[Pointer]:
    """Every pointer of a rendered conversation ``text`` whose tokens have character ``offsets``."""
    slots = _Slots(scene, grid_h, grid_w)
    out: list[Pointer] = []
    cursor = 0
    for turn in turns:
        start = text.index(turn.question, cursor)
        cursor = start + len(turn.question)
        lowered = turn.question.lower()
        for mention in turn.mentions:
            at = lowered.rfind(mention.text)
            if at >= 0:
                end = token_ending_at(offsets, start + at + len(mention.text))
                out.append(Pointer(end, MENTION_LAYER, 0, (slots.object(mention.obj),)))
        question = _question_end(turn, slots)
        if question is not None:
            out.append(Pointer(token_ending_at(offsets, cursor), MENTION_LAYER, 0, question))
        assistant = token_ending_at(offsets, text.index(ASSISTANT, cursor) + len(ASSISTANT))
        for head, looked_at in enumerate(_answer(turn, slots)):
            out.append(Pointer(assistant, ANSWER_LAYER, head, looked_at))
    return out
