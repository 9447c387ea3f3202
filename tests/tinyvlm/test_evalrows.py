"""The eval's rows: the first model's held-out set unchanged, every row big enough, each surface
change made exactly, JSON answers scored on their value."""

import hashlib
from typing import ClassVar

import pytest

from tinyvlm import evalrows, evalsets, render
from tinyvlm.questions import Turn
from tinyvlm.scene import Glyph, Obj

# sha256 of the first model's held-out set (scenes, questions, answers) and of the wide set's first
# 251 items, as the evaluation of the first bundled model drew them (commit d647f38).
FIRST_MODEL_SETS = "44a0e06b1373c4d6be9b6d010f885d899c42901d2064fe8eff7ba6721a5dd7e7"


class _AsFirstDrawn:
    """Repr of an Obj or Glyph with only the fields it had then: the drawing fields added since for
    training's augmentation stay at their defaults in the eval (a test below checks that)."""

    FIELDS: ClassVar[dict[str, tuple[str, ...]]] = {
        "Obj": ("shape", "colour", "size", "cell", "dx", "dy", "radius", "rgb"),
        "Glyph": ("char", "cell", "rgb"),
    }

    def __init__(self, value: Obj | Glyph | None) -> None:
        self.value = value

    def __repr__(self) -> str:
        if self.value is None:
            return "None"
        kind = type(self.value).__name__
        fields = ", ".join(f"{name}={getattr(self.value, name)!r}" for name in self.FIELDS[kind])
        return f"{kind}({fields})"


def test_the_first_models_held_out_set_is_unchanged() -> None:
    digest = hashlib.sha256()
    for eval_set in (evalsets.HELDOUT, evalsets.WIDE):
        for i, item in enumerate(evalsets.items(eval_set, 2000)):
            if eval_set is evalsets.WIDE and i > 250:
                break
            scene = item.scene
            turns = [(t.question, t.answer) for t in item.turns]
            objects = tuple(_AsFirstDrawn(obj) for obj in scene.objects)
            glyph = _AsFirstDrawn(scene.glyph)
            digest.update(repr((scene.width, scene.height, objects, glyph, turns)).encode())
    assert digest.hexdigest() == FIRST_MODEL_SETS


@pytest.fixture(scope="module")
def rows() -> dict[str, evalrows.Row]:
    return {row.name: row for row in evalrows.rows()}


def test_every_row_has_at_least_300_questions(rows: dict[str, evalrows.Row]) -> None:
    for row in rows.values():
        assert sum(len(item.turns) for item in row.items) >= 300, row.name
        if row.unchanged is not None:
            assert row.unchanged in rows


def test_surface_changes_change_only_what_they_say(rows: dict[str, evalrows.Row]) -> None:
    base = rows["surface/unchanged"].items
    capitals = rows["surface/capitals"].items
    assert [c.turns[0].question for c in capitals] == [b.turns[0].question.upper() for b in base]
    assert all(c.turns[0].answer == b.turns[0].answer for c, b in zip(capitals, base, strict=True))
    assert all("object" in i.turns[0].question for i in rows["surface/objects_for_shapes"].items)
    assert all("corner" in i.turns[0].question for i in rows["surface/top_left_corner"].items)
    assert all(i.system == evalrows.OWN_SYSTEM_PROMPT for i in rows["surface/own_system_prompt"].items)
    assert all(i.renderer == "second" for i in rows["second_renderer"].items)
    for item in rows["surface/off_centre"].items[:50]:  # pushed off centre, still inside its cell
        for obj in item.scene.objects:
            x, y, _ = render.object_geometry(obj, item.scene.width, item.scene.height)
            cell_w, cell_h = item.scene.width / 3, item.scene.height / 3
            assert obj.cell[0] * cell_w <= x < (obj.cell[0] + 1) * cell_w
            assert obj.cell[1] * cell_h <= y < (obj.cell[1] + 1) * cell_h
            assert abs(obj.dx) + abs(obj.dy) > 0 or obj.radius >= 0.45


def test_json_answers_are_scored_on_their_value() -> None:
    colour = Turn(
        "What colour? Answer in JSON.", '{"colour":"red"}', "colour", False, False, json=True, plain="red"
    )
    assert evalrows.answer_is_right(colour, '{"color": "red"}')
    assert not evalrows.answer_is_right(colour, '{"colour":"blue"}')
    assert not evalrows.answer_is_right(colour, "red")
    count = Turn("How many? (JSON)", '{"count":2}', "count", False, False, json=True, plain="2")
    assert evalrows.answer_is_right(count, '{"number":2}')
    assert not evalrows.answer_is_right(count, '{"count":"2"}')
