"""The eval's rows for people's own wording and pictures (issue 21), beside the first model's
held-out and wide sets (``tinyvlm.evalsets``).

- ``seen_families``: the training grammar's families on new pictures of the training look.
- ``held_out_families``: only frames, cores and pronouns training never saw.
- ``surface/<change>``: one surface change at a time, paired with the same items unchanged: the
  question in capitals, with "please", a lower-case first letter, a trailing space, "objects" for
  "shapes", "in the top-left corner" for "in the top left", a system prompt of one's own, the
  question sent before its picture, objects off their cell's centre, a frame around the picture, a
  glyph font training never saw.
- ``second_renderer``: the same conversations drawn by ``tinyvlm.second_renderer``, paired with
  ``tinyvlm.render``'s pictures of them.
- ``unknown/*``: questions outside the model's world, answered "I can't tell" (held-out topics, and
  the training topics on new pictures); ``presence``: "Is there a star?"; ``json``: answers asked
  for as JSON, scored on the value.
"""

import json
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from tinyvlm import dialogue, grammar, questions
from tinyvlm.evalsets import Item
from tinyvlm.questions import Turn
from tinyvlm.scene import (
    HELD_OUT_FONT,
    LEGACY_SPEC,
    VARIED_SPEC,
    VARIETY_SLACK,
    Scene,
    SceneSpec,
    sample_scene,
)

SEED = 20261203
ROW_QUESTIONS = 300
OWN_SYSTEM_PROMPT = "You are a careful assistant for a visually impaired user. Reply with the answer only."


@dataclass(frozen=True)
class Row:
    name: str
    items: list[Item]
    unchanged: str | None = None  # the row holding the same items without the change


Maker = Callable[[random.Random], Item | None]


def draw_items(name: str, make: Maker, questions_wanted: int = ROW_QUESTIONS) -> list[Item]:
    """Items from ``make`` (None: skip this draw) until ``questions_wanted`` questions are asked."""
    out: list[Item] = []
    asked, index = 0, 0
    while asked < questions_wanted:
        item = make(random.Random(f"{name}-{SEED}-{index}"))
        index += 1
        if item is not None:
            out.append(item)
            asked += len(item.turns)
    return out


def _conversation(spec: SceneSpec, style: dialogue.Style) -> Maker:
    def make(rng: random.Random) -> Item:
        scene = sample_scene(rng, spec)
        return Item(scene, dialogue.conversation(scene, rng, style))

    return make


def _single(ask: Callable[[Scene, random.Random], Turn | None], spec: SceneSpec = VARIED_SPEC) -> Maker:
    def make(rng: random.Random) -> Item | None:
        scene = sample_scene(rng, spec)
        turn = ask(scene, rng)
        return None if turn is None else Item(scene, [turn])

    return make


def _legacy_single(rng: random.Random) -> Item:
    """One question in the first model's seen phrasings, on a picture of its look: the base that
    each surface change alters."""
    scene = sample_scene(rng, LEGACY_SPEC)
    return Item(scene, questions.conversation(scene, rng, held_out=False, n_turns=1))


# Surface changes: an item -> the changed item, or None where the change does not apply.
Change = Callable[[Item], Item | None]


def _question_change(edit: Callable[[str], str | None]) -> Change:
    def change(item: Item) -> Item | None:
        text = edit(item.turns[0].question)
        return None if text is None else replace(item, turns=[replace(item.turns[0], question=text)])

    return change


def _with_please(text: str) -> str:
    mark = text[-1] if text[-1] in "?." else ""
    return text[: len(text) - len(mark)] + ", please" + mark


_SHAPE_NOUN = re.compile(r"\b(the (?:\w+ )?)shape\b(?! of)|\bshapes\b")


def _objects_for_shapes(text: str) -> str | None:
    """ "the red shape" -> "the red object", "how many shapes" -> "how many objects"."""
    changed = _SHAPE_NOUN.sub(lambda m: m.group(1) + "object" if m.group(1) else "objects", text)
    return changed if changed != text else None


_CORNER = re.compile(r"in the (top|bottom) (left|right)\b")


def _corner(text: str) -> str | None:
    changed = _CORNER.sub(r"in the \1-\2 corner", text)
    return changed if changed != text else None


def _off_centre(item: Item) -> Item:
    """Every object pushed as far from its cell's centre as the training pictures allow."""
    rng = random.Random(str(item.turns[0].question))
    moved = []
    for obj in item.scene.objects:
        slack = max(0.0, 0.5 - obj.radius) * VARIETY_SLACK
        moved.append(replace(obj, dx=rng.choice((-slack, slack)), dy=rng.choice((-slack, slack))))
    return replace(item, scene=replace(item.scene, objects=tuple(moved)))


def _framed(item: Item) -> Item:
    return replace(item, scene=replace(item.scene, frame=(90, 90, 90), frame_width=0.03))


SURFACE_CHANGES: dict[str, Change] = {
    "capitals": _question_change(str.upper),
    "please": _question_change(_with_please),
    "lower_first": _question_change(lambda t: t[0].lower() + t[1:]),
    "trailing_space": _question_change(lambda t: t + " "),
    "objects_for_shapes": _question_change(_objects_for_shapes),
    "top_left_corner": _question_change(_corner),
    "own_system_prompt": lambda item: replace(item, system=OWN_SYSTEM_PROMPT),
    "text_first": lambda item: replace(item, text_first=True),  # [question, picture], as OpenAI docs write
    "off_centre": _off_centre,
    "frame": _framed,
}


def _changed(name: str, change: Change, base: Row) -> Row:
    """``base``'s items with ``change`` made, where it applies; compared with ``base`` itself."""
    return Row(
        f"surface/{name}",
        [changed for item in base.items if (changed := change(item)) is not None],
        base.name,
    )


def _paired(name: str, change: Change, base: Maker) -> tuple[Row, Row]:
    """Items ``change`` applies to, unchanged and changed."""
    pairs: list[tuple[Item, Item]] = []

    def make(rng: random.Random) -> Item | None:
        item = base(rng)
        changed = None if item is None else change(item)
        if item is not None and changed is not None:
            pairs.append((item, changed))
        return changed

    draw_items(f"surface-{name}", make)
    unchanged = Row(f"surface/{name}/unchanged", [u for u, _ in pairs])
    return unchanged, Row(f"surface/{name}", [c for _, c in pairs], unchanged.name)


def _corner_question(rng: random.Random) -> Item | None:
    """A question naming an object in a corner by its place ("the shape in the top left")."""
    scene = sample_scene(rng, LEGACY_SPEC)
    corners = [o for o in scene.objects if o.cell[0] != 1 and o.cell[1] != 1]
    if not corners:
        return None
    obj = rng.choice(corners)
    turn = questions.ask_attribute(
        obj, rng.choice(("shape", "colour", "size")), scene, rng, False, ("position",)
    )
    return None if turn is None else Item(scene, [turn])


def _text_question(rng: random.Random) -> Item | None:
    scene = sample_scene(rng, replace(LEGACY_SPEC, glyph_prob=1.0))
    turn = questions.ask_text(scene, rng, held_out=False)
    return None if turn is None else Item(scene, [turn])


def _other_font(item: Item) -> Item:
    return replace(item, scene=replace(item.scene, font=HELD_OUT_FONT))


def surface_rows() -> Iterator[Row]:
    base = Row("surface/unchanged", draw_items("surface", _legacy_single))
    yield base
    for name, change in SURFACE_CHANGES.items():
        if name not in ("objects_for_shapes", "top_left_corner"):
            yield _changed(name, change, base)
    yield from _paired("objects_for_shapes", SURFACE_CHANGES["objects_for_shapes"], _legacy_single)
    yield from _paired("top_left_corner", SURFACE_CHANGES["top_left_corner"], _corner_question)
    yield from _paired("other_font", _other_font, _text_question)


def _second_renderer() -> list[Row]:
    def make(rng: random.Random) -> Item:
        scene = sample_scene(rng, LEGACY_SPEC)
        return Item(scene, questions.conversation(scene, rng, held_out=False), renderer="second")

    items = draw_items("second-renderer", make)
    first = Row("second_renderer/first_renderer", [replace(i, renderer="first") for i in items])
    return [first, Row("second_renderer", items, first.name)]


def _unknown(split: grammar.Split) -> Maker:
    return _single(lambda scene, rng: dialogue.ask_unknown(scene, rng, split))


def _json(rng: random.Random) -> Item | None:
    scene = sample_scene(rng, VARIED_SPEC)
    turn, _ = dialogue.fresh_question(scene, rng, dialogue.PLAIN)
    return Item(scene, [dialogue.as_json(turn, rng)]) if turn.qtype != "unknown" else None


def rows() -> Iterator[Row]:
    """Every row of the people's-own-words eval, in report order."""
    yield Row("seen_families", draw_items("seen", _conversation(VARIED_SPEC, dialogue.PLAIN), 600))
    yield Row(
        "held_out_families", draw_items("held", _conversation(VARIED_SPEC, dialogue.HELD_OUT_FAMILIES), 400)
    )
    yield from surface_rows()
    yield from _second_renderer()
    yield Row("unknown/held_out_topics", draw_items("unknown-held", _unknown(grammar.Split.HELD_OUT)))
    yield Row("unknown/training_topics", draw_items("unknown-seen", _unknown(grammar.Split.TRAIN)))
    presence = _single(lambda scene, rng: dialogue.ask_presence(scene, rng, grammar.Split.TRAIN))
    yield Row("presence", draw_items("presence", presence))
    yield Row("json", draw_items("json", _json))


def answer_is_right(turn: Turn, given: str) -> bool:
    """Exact match; for a JSON answer, a one-key object whose value is the answer."""
    if not turn.json:
        return given == turn.answer
    try:
        parsed = json.loads(given)
    except ValueError:
        return False
    if not isinstance(parsed, dict) or len(parsed) != 1:
        return False
    value = next(iter(parsed.values()))
    return str(value) == turn.bare_answer and (turn.qtype == "count") == isinstance(value, int)
