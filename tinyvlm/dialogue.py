"""Conversations in people's words (``tinyvlm.grammar``): every question type of
``tinyvlm.questions`` plus "Is there a star?" (yes/no), questions the model cannot answer
("I can't tell"), and answers asked for as JSON.

``tinyvlm.questions`` keeps the first model's six phrasings per type: the eval's held-out set is
drawn through it unchanged, so its figures compare across models.
"""

import random
from dataclasses import dataclass, replace

from tinyvlm import grammar, vocab
from tinyvlm import phrasebook as pb
from tinyvlm.grammar import Split
from tinyvlm.questions import ATTRIBUTES, LEAKS, Mention, Turn, plain_refs, relative_ref, turn_loop
from tinyvlm.scene import Obj, Scene


@dataclass(frozen=True)
class Style:
    """How a conversation is asked: which families, and how often noise and JSON appear."""

    split: Split = Split.TRAIN
    noise: bool = True
    json_share: float = 0.06
    unknown_weight: float = 0.8
    compositional_unknowns: bool = False  # training: grammar.compositional_unknown
    filler_share: float = 0.0  # training: a stray unknown word around the question (grammar.with_filler)


TRAINING = Style(unknown_weight=1.2, compositional_unknowns=True, filler_share=0.12)
HELD_OUT_FAMILIES = Style(Split.HELD_OUT, noise=False, json_share=0.0, unknown_weight=0.0)
PLAIN = Style(noise=False, json_share=0.0, unknown_weight=0.0)  # training families, no noise


def _plain_refs(obj: Obj, scene: Scene, rng: random.Random) -> dict[str, str]:
    """References naming ``obj`` by its own unique colour and/or shape, in varied words."""
    return plain_refs(obj, scene, lambda: grammar.shape_noun(rng))


def _relative_ref(obj: Obj, scene: Scene, rng: random.Random) -> tuple[str, Mention] | None:
    """'the thing to the left of the red circle': the anchor sits in the adjacent cell."""

    def lead(word: str) -> str:
        said = rng.choice(pb.NEIGHBOUR_WORDS[word])
        return f"the {grammar.shape_noun(rng)} {said}"

    return relative_ref(obj, scene, rng, lambda: grammar.shape_noun(rng), lead)


def references(obj: Obj, scene: Scene, rng: random.Random) -> dict[str, tuple[str, tuple[Mention, ...]]]:
    """Reference kind -> (text, the plain references inside it, the object itself included)."""
    refs: dict[str, tuple[str, tuple[Mention, ...]]] = {
        kind: (text, (Mention(text, obj),)) for kind, text in _plain_refs(obj, scene, rng).items()
    }
    cell = grammar.cell_phrase(vocab.CELL_NAMES[obj.cell], rng)
    position = f"the {grammar.shape_noun(rng)} {cell}"
    refs["position"] = (position, (Mention(position, obj),))
    relative = _relative_ref(obj, scene, rng)
    if relative is not None:
        refs["relative"] = (relative[0], (relative[1],))
    return refs


def _answer(obj: Obj, attr: str) -> str:
    return vocab.CELL_NAMES[obj.cell] if attr == "position" else str(getattr(obj, attr))


def ask_attribute(obj: Obj, attr: str, scene: Scene, rng: random.Random, split: Split) -> Turn | None:
    refs = {k: v for k, v in references(obj, scene, rng).items() if k not in LEAKS[attr]}
    if not refs:
        return None
    ref, mentions = refs[rng.choice(sorted(refs))]
    said = grammar.phrasing(attr, rng, split)
    question = grammar.fill(said.template, ref=ref)
    return Turn(question, _answer(obj, attr), attr, False, said.held_out, mentions, obj, family=said.family)


def ask_follow_up(obj: Obj, attr: str, rng: random.Random, split: Split) -> Turn:
    said = grammar.follow_up(attr, rng, split)
    question = grammar.fill(said.template)
    return Turn(question, _answer(obj, attr), attr, True, said.held_out, about=obj, family=said.family)


def _kind_phrase(scene: Scene, rng: random.Random) -> tuple[str, str, tuple[Obj, ...]]:
    """A kind of object, as a plural ("red shapes") and a singular indefinite ("a red shape"), and the
    objects of the scene of that kind: all, one colour, one shape, or one colour and shape."""
    objs = scene.objects
    roll = rng.random()
    if roll < 0.3:
        noun = rng.choice([n for n in pb.SHAPE_NOUNS if n != "one"])
        return grammar.shapes_noun(rng), ("an " if noun[0] in "aeiou" else "a ") + noun, objs
    colour = rng.choice([o.colour for o in objs] + [rng.choice(list(vocab.COLOURS))])
    shape = rng.choice([o.shape for o in objs] + [rng.choice(vocab.SHAPES)])
    article = "an" if colour[0] in "aeiou" else "a"
    if roll < 0.6:
        counted = tuple(o for o in objs if o.colour == colour)
        return (
            f"{colour} {grammar.shapes_noun(rng)}",
            f"{article} {colour} {grammar.shape_noun(rng)}",
            counted,
        )
    if roll < 0.85:
        shape_article = "an" if shape[0] in "aeiou" else "a"
        return _plural(shape), f"{shape_article} {shape}", tuple(o for o in objs if o.shape == shape)
    counted = tuple(o for o in objs if (o.colour, o.shape) == (colour, shape))
    return f"{colour} {_plural(shape)}", f"{article} {colour} {shape}", counted


def _plural(shape: str) -> str:
    return shape + ("es" if shape.endswith("s") else "s")


def ask_count(scene: Scene, rng: random.Random, split: Split) -> Turn:
    plural, _, counted = _kind_phrase(scene, rng)
    said = grammar.phrasing("count", rng, split)
    question = grammar.fill(said.template, what=plural)
    return Turn(
        question, str(len(counted)), "count", False, said.held_out, counted=counted, family=said.family
    )


def ask_presence(scene: Scene, rng: random.Random, split: Split) -> Turn:
    """ "Is there a red circle?": yes or no. The question end counts the matches (``counted``)."""
    _, single, counted = _kind_phrase(scene, rng)
    said = grammar.phrasing("presence", rng, split)
    question = grammar.fill(said.template, obj=single)
    answer = "yes" if counted else "no"
    return Turn(question, answer, "presence", False, said.held_out, counted=counted, family=said.family)


def ask_relative(scene: Scene, rng: random.Random, split: Split) -> Turn | None:
    named = [(o, _plain_refs(o, scene, rng)) for o in scene.objects]
    named = [(o, refs) for o, refs in named if refs]
    axis = rng.choice((0, 1))
    pairs = [(a, b) for a in named for b in named if a[0] is not b[0] and a[0].cell[axis] != b[0].cell[axis]]
    if not pairs:
        return None
    (a, a_refs), (b, b_refs) = rng.choice(pairs)
    if axis == 0:
        kind, answer = "relative_h", "left" if a.cell[0] < b.cell[0] else "right"
    else:
        kind, answer = "relative_v", "above" if a.cell[1] < b.cell[1] else "below"
    said = grammar.phrasing(kind, rng, split)
    ref, other = a_refs[rng.choice(sorted(a_refs))], b_refs[rng.choice(sorted(b_refs))]
    question = grammar.fill(said.template, ref=ref, other=other)
    mentions = (Mention(ref, a), Mention(other, b))
    return Turn(question, answer, "relative", False, said.held_out, mentions, about=a, family=said.family)


def ask_text(scene: Scene, rng: random.Random, split: Split) -> Turn | None:
    if scene.glyph is None:
        return None
    said = grammar.phrasing("text", rng, split)
    return Turn(
        grammar.fill(said.template), scene.glyph.char, "text", False, said.held_out, family=said.family
    )


def ask_unknown(scene: Scene, rng: random.Random, split: Split, compositional: bool = False) -> Turn:
    """A question about something the model does not know, answered "I can't tell"."""
    obj = rng.choice(scene.objects)
    refs = _plain_refs(obj, scene, rng)
    ref = rng.choice(sorted(refs.values())) if refs else "the shape"
    if compositional:
        question, family = grammar.compositional_unknown(rng, ref)
    else:
        question, family = grammar.unknown_question(rng, split, ref)
    return Turn(question, pb.CANNOT_TELL, "unknown", False, split is Split.HELD_OUT, family=family)


def as_json(turn: Turn, rng: random.Random) -> Turn:
    instruction, answer = grammar.json_answer(turn.qtype, turn.answer, rng)
    return replace(turn, question=turn.question + instruction, answer=answer, json=True, plain=turn.answer)


def fresh_question(
    scene: Scene, rng: random.Random, style: Style, done: frozenset[str] | set[str] = frozenset()
) -> tuple[Turn, Obj | None]:
    """A new (not follow-up) question of any type; returns the object it is about, if any."""
    kinds = ("attribute", "count", "relative", "text", "presence", "unknown")
    weights = (5, 1.5, 1.5, 1.5, 1.2, style.unknown_weight)
    while True:
        kind = rng.choices(kinds, weights=weights)[0]
        if kind == "text" and "text" in done:
            continue
        if kind == "attribute":
            obj = rng.choice(scene.objects)
            turn = ask_attribute(obj, rng.choice(ATTRIBUTES), scene, rng, style.split)
            if turn is not None:
                return turn, obj
        elif kind == "unknown":
            return ask_unknown(scene, rng, style.split, style.compositional_unknowns), None
        elif kind in ("count", "presence"):
            return (ask_count if kind == "count" else ask_presence)(scene, rng, style.split), None
        else:
            turn_or_none = (ask_relative if kind == "relative" else ask_text)(scene, rng, style.split)
            if turn_or_none is not None:
                return turn_or_none, None


def dressed(turn: Turn, rng: random.Random, style: Style = TRAINING) -> Turn:
    """The turn as typed: a stray word now and then, JSON asked for now and then, and surface noise."""
    if style.filler_share and rng.random() < style.filler_share:
        turn = replace(turn, question=grammar.with_filler(turn.question, rng))
    if style.json_share and rng.random() < style.json_share:
        turn = as_json(turn, rng)
    if style.noise:
        turn = replace(turn, question=grammar.noisy(turn.question, rng))
    return turn


def conversation(
    scene: Scene, rng: random.Random, style: Style = TRAINING, n_turns: int | None = None
) -> list[Turn]:
    """A conversation in people's words (``questions.turn_loop``), each question dressed as typed."""

    def fresh(done: set[str]) -> tuple[Turn, Obj | None]:
        turn, obj = fresh_question(scene, rng, style, done)
        return dressed(turn, rng, style), obj

    def follow_up(obj: Obj, attr: str) -> Turn:
        return dressed(ask_follow_up(obj, attr, rng, style.split), rng, style)

    return turn_loop(rng, n_turns, follow_up, fresh)


def system_prompt(rng: random.Random) -> str | None:
    """None (the template's default) most of the time, else a prompt of people's own."""
    roll = rng.random()
    if roll < 0.6:
        return None
    if roll < 0.7:
        return vocab.DEFAULT_SYSTEM_PROMPT
    return rng.choice(pb.SYSTEM_PROMPTS)
