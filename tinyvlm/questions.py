"""Conversations about one scene: 1-3 turns, follow-ups about the same object ("And its colour?").

Every question is answerable from the picture alone and has one short exact answer.
"""

import random
from collections.abc import Callable
from dataclasses import dataclass

from tinyvlm import templates, vocab
from tinyvlm.scene import Obj, Scene

ATTRIBUTES = ("shape", "colour", "size", "position")
# Reference kinds that would give away the answer to a question about that attribute.
LEAKS = {
    "shape": {"shape", "colour_shape"},
    "colour": {"colour", "colour_shape"},
    "size": set(),
    "position": {"position", "relative"},
}
NEIGHBOURS = {"left of": (-1, 0), "right of": (1, 0), "above": (0, -1), "below": (0, 1)}


@dataclass(frozen=True)
class Mention:
    """A referring expression in a question ("the red circle") and the object it names."""

    text: str
    obj: Obj


@dataclass(frozen=True)
class Turn:
    question: str
    answer: str
    qtype: str  # shape, colour, size, position, count, relative, text
    follow_up: bool
    held_out_phrasing: bool
    # What the question refers to, for training only (tinyvlm.referents): every plain reference in
    # it (anchors of relative references included) and the object the answer is about.
    mentions: tuple[Mention, ...] = ()
    about: Obj | None = None
    counted: tuple[Obj, ...] = ()  # the objects a count (or presence) question counts
    family: str = "legacy"  # the phrasing family (tinyvlm.grammar), "legacy" for this module's
    json: bool = False  # asked for JSON: ``answer`` is JSON, ``plain`` the bare answer
    plain: str = ""

    @property
    def bare_answer(self) -> str:
        return self.plain or self.answer


def _attribute(obj: Obj, attr: str) -> str:
    return vocab.CELL_NAMES[obj.cell] if attr == "position" else str(getattr(obj, attr))


def plain_refs(obj: Obj, scene: Scene, noun: Callable[[], str] = lambda: "shape") -> dict[str, str]:
    """Referring expressions naming the object by its own unique colour and/or shape (``noun``:
    the word standing for "shape" in "the red shape")."""
    others = [o for o in scene.objects if o is not obj]
    refs = {}
    if all(o.colour != obj.colour for o in others):
        refs["colour"] = f"the {obj.colour} {noun()}"
    if all(o.shape != obj.shape for o in others):
        refs["shape"] = f"the {obj.shape}"
    if all((o.colour, o.shape) != (obj.colour, obj.shape) for o in others):
        refs["colour_shape"] = f"the {obj.colour} {obj.shape}"
    return refs


def relative_ref(
    obj: Obj,
    scene: Scene,
    rng: random.Random,
    noun: Callable[[], str] = lambda: "shape",
    lead: Callable[[str], str] = lambda word: f"the shape {word}",
) -> tuple[str, Mention] | None:
    """'the shape left of the red circle': the anchor sits in the adjacent cell (``lead``: how
    "the shape left of" is said for each of NEIGHBOURS' words)."""
    options = []
    for word, (dc, dr) in NEIGHBOURS.items():
        anchor_cell = (obj.cell[0] - dc, obj.cell[1] - dr)
        for anchor in scene.objects:
            plain = plain_refs(anchor, scene, noun)
            if anchor.cell == anchor_cell and plain:
                anchor_text = rng.choice(sorted(plain.values()))
                options.append((f"{lead(word)} {anchor_text}", Mention(anchor_text, anchor)))
    return rng.choice(options) if options else None


def references(obj: Obj, scene: Scene, rng: random.Random) -> dict[str, tuple[str, tuple[Mention, ...]]]:
    """Reference kind -> (text, the plain references inside it, the object itself included)."""
    refs: dict[str, tuple[str, tuple[Mention, ...]]] = {
        kind: (text, (Mention(text, obj),)) for kind, text in plain_refs(obj, scene).items()
    }
    position = f"the shape {templates.CELL_PHRASES[vocab.CELL_NAMES[obj.cell]]}"
    refs["position"] = (position, (Mention(position, obj),))
    relative = relative_ref(obj, scene, rng)
    if relative is not None:
        refs["relative"] = (relative[0], (relative[1],))
    return refs


def _pick(kind: str, rng: random.Random, held_out: bool, follow_up: bool = False) -> tuple[str, bool]:
    options = templates.phrasings(kind, follow_up=follow_up, held_out=held_out)
    index = rng.randrange(len(options))
    return options[index], held_out and index == len(options) - 1


def ask_attribute(
    obj: Obj, attr: str, scene: Scene, rng: random.Random, held_out: bool, kinds: tuple[str, ...] = ()
) -> Turn | None:
    """A question about ``obj``'s ``attr``, naming it by one of its references (of ``kinds``, if given)."""
    refs = {k: v for k, v in references(obj, scene, rng).items() if k not in LEAKS[attr]}
    if kinds:
        refs = {k: v for k, v in refs.items() if k in kinds}
    if not refs:
        return None
    ref, mentions = refs[rng.choice(sorted(refs))]
    phrasing, unseen = _pick(attr, rng, held_out)
    question = phrasing.format(ref=ref)
    return Turn(question[0].upper() + question[1:], _attribute(obj, attr), attr, False, unseen, mentions, obj)


def ask_follow_up(obj: Obj, attr: str, rng: random.Random, held_out: bool) -> Turn:
    phrasing, unseen = _pick(attr, rng, held_out, follow_up=True)
    return Turn(phrasing, _attribute(obj, attr), attr, True, unseen, about=obj)


TOTALS_SHARE = 0.4  # of count questions, how many count all shapes (the rest: one colour or shape)
# A count question's kind is drawn as a roll in [0, 1); these ranges pin it to one kind.
COUNT_KINDS = {"any": (0.0, 1.0), "all": (0.0, TOTALS_SHARE), "one_kind": (TOTALS_SHARE, 1.0)}


def ask_count(scene: Scene, rng: random.Random, held_out: bool, kind: str = "any") -> Turn:
    """How many shapes ("all"), or shapes of one colour or one shape ("one_kind"), or either."""
    objs = scene.objects
    roll = rng.uniform(*COUNT_KINDS[kind])
    if roll < TOTALS_SHARE:
        what, counted = "shapes", objs
    elif roll < 0.7:
        colour = rng.choice([o.colour for o in objs] + [rng.choice(list(vocab.COLOURS))])
        what, counted = f"{colour} shapes", tuple(o for o in objs if o.colour == colour)
    else:
        shape = rng.choice([o.shape for o in objs] + [rng.choice(vocab.SHAPES)])
        what, counted = templates.plural(shape), tuple(o for o in objs if o.shape == shape)
    phrasing, unseen = _pick("count", rng, held_out)
    return Turn(phrasing.format(what=what), str(len(counted)), "count", False, unseen, counted=counted)


# The attributes a relative reference does not give away (it names the place).
THROUGH_RELATIVE = tuple(a for a in ATTRIBUTES if "relative" not in LEAKS[a])


def drills(scene: Scene, rng: random.Random, more: Callable[[], list[Turn]] = list) -> list[Turn]:
    """Two attribute questions through relative references ("the shape left of the red circle"),
    where the scene has them, a left/right or above/below question (the type that falls to chance
    when the joint stage runs long), ``more`` turns, a count of one colour or shape and a count of
    all shapes."""
    turns = []
    for obj in rng.sample(scene.objects, min(2, len(scene.objects))):
        turn = ask_attribute(obj, rng.choice(THROUGH_RELATIVE), scene, rng, False, kinds=("relative",))
        if turn is not None:
            turns.append(turn)
    relative = ask_relative(scene, rng, False)
    turns += [relative] if relative is not None else []
    turns += more()
    return [*turns, ask_count(scene, rng, False, "one_kind"), ask_count(scene, rng, False, "all")]


def ask_relative(scene: Scene, rng: random.Random, held_out: bool) -> Turn | None:
    named = [(o, plain_refs(o, scene)) for o in scene.objects]
    named = [(o, refs) for o, refs in named if refs]
    pairs = [(a, b) for a in named for b in named if a[0] is not b[0]]
    axis = rng.choice((0, 1))
    pairs = [(a, b) for a, b in pairs if a[0].cell[axis] != b[0].cell[axis]]
    if not pairs:
        return None
    (a, a_refs), (b, b_refs) = rng.choice(pairs)
    if axis == 0:
        kind, answer = "relative_h", "left" if a.cell[0] < b.cell[0] else "right"
    else:
        kind, answer = "relative_v", "above" if a.cell[1] < b.cell[1] else "below"
    phrasing, unseen = _pick(kind, rng, held_out)
    ref, other = a_refs[rng.choice(sorted(a_refs))], b_refs[rng.choice(sorted(b_refs))]
    question = phrasing.format(ref=ref, other=other)
    mentions = (Mention(ref, a), Mention(other, b))
    question = question[0].upper() + question[1:]
    return Turn(question, answer, "relative", False, unseen, mentions, about=a)


def ask_text(scene: Scene, rng: random.Random, held_out: bool) -> Turn | None:
    if scene.glyph is None:
        return None
    phrasing, unseen = _pick("text", rng, held_out)
    return Turn(phrasing, scene.glyph.char, "text", False, unseen)


def _fresh_question(
    scene: Scene, rng: random.Random, held_out: bool, done: set[str]
) -> tuple[Turn, Obj | None]:
    """A new (not follow-up) question; returns the object it was about, if any."""
    while True:
        kind = rng.choices(("attribute", "count", "relative", "text"), weights=(5, 1.5, 1.5, 1.5))[0]
        if kind == "text" and "text" in done:
            continue  # one glyph: asking it twice teaches nothing
        if kind == "attribute":
            obj = rng.choice(scene.objects)
            turn = ask_attribute(obj, rng.choice(ATTRIBUTES), scene, rng, held_out)
            if turn is not None:
                return turn, obj
        elif kind == "count":
            return ask_count(scene, rng, held_out), None
        else:
            other = (
                ask_relative(scene, rng, held_out) if kind == "relative" else ask_text(scene, rng, held_out)
            )
            if other is not None:
                return other, None


def turn_loop(
    rng: random.Random,
    n_turns: int | None,
    follow_up: Callable[[Obj, str], Turn],
    fresh: Callable[[set[str]], tuple[Turn, Obj | None]],
) -> list[Turn]:
    """1-3 turns (or ``n_turns``); a follow-up asks another attribute of the previous turn's object.
    ``fresh(done)`` asks a new question (of a type not in ``done`` where that matters)."""
    if n_turns is None:
        n_turns = rng.choices((1, 2, 3), weights=(0.35, 0.35, 0.3))[0]
    turns: list[Turn] = []
    obj: Obj | None = None
    asked: set[str] = set()
    done: set[str] = set()
    while len(turns) < n_turns:
        remaining = [a for a in ATTRIBUTES if a not in asked]
        if obj is not None and remaining and rng.random() < 0.7:
            attr = rng.choice(remaining)
            turns.append(follow_up(obj, attr))
            asked.add(attr)
            continue
        turn, obj = fresh(done)
        asked = {turn.qtype}
        done.add(turn.qtype)
        turns.append(turn)
    return turns


def conversation(
    scene: Scene, rng: random.Random, held_out: bool = False, n_turns: int | None = None
) -> list[Turn]:
    """A conversation in the first model's phrasings (``turn_loop``)."""
    return turn_loop(
        rng,
        n_turns,
        lambda obj, attr: ask_follow_up(obj, attr, rng, held_out),
        lambda done: _fresh_question(scene, rng, held_out, done),
    )
