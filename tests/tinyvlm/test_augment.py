"""Training's augmentation (``SceneSpec.augment``) and compositional unknowns: what they draw and ask,
and that the eval's pictures and questions never get either."""

import random
import re
from dataclasses import replace

import numpy as np

from tinyvlm import data, dialogue, evalrows, grammar, labels, render
from tinyvlm import phrasebook as pb
from tinyvlm.scene import TRAIN_SPEC, VARIED_SPEC, VARIETY_SLACK, Glyph, Obj, Scene, sample_scene

DRAWING_DEFAULTS = {"extent": 1.0, "angle": 0.0, "arm": 0.35, "inner": 0.45}
GLYPH_DEFAULTS = {"shear": 0.0, "stretch": 1.0, "angle": 0.0}
# Words of the training frames that hold a held-out word by chance ("located" holds "cat").
FRAME_WORDS = {"located", "locate", "location"}


def _in_corner(obj: Obj) -> bool:
    """Both offsets beyond three quarters of the room the varied look allows."""
    room = max(0.0, 0.5 - obj.radius) * VARIETY_SLACK
    return room > 0 and min(abs(obj.dx), abs(obj.dy)) > 0.75 * room


def _objects(spec: object, n: int = 400) -> list[Obj]:
    rng = random.Random(11)
    return [obj for _ in range(n) for obj in sample_scene(rng, spec).objects]  # type: ignore[arg-type]


def test_augmented_offsets_put_objects_in_their_cells_corners() -> None:
    trained, varied = _objects(TRAIN_SPEC), _objects(VARIED_SPEC)
    in_corner_trained = sum(map(_in_corner, trained)) / len(trained)
    in_corner_varied = sum(map(_in_corner, varied)) / len(varied)
    assert in_corner_varied < 0.1 < 0.2 < in_corner_trained  # uniform: 1/16 of the mass; edge-heavy: ~1/4


def test_augmented_objects_and_glyphs_are_drawn_their_own_way() -> None:
    objects = _objects(TRAIN_SPEC)
    varied = [o for o in objects if (o.extent, o.angle) != (1.0, 0.0)]
    assert 0.6 < len(varied) / len(objects) < 0.9  # a quarter of pictures keep the first look
    assert all(0.88 <= o.extent <= 1.05 and abs(o.angle) <= 10 and 0.2 <= o.arm <= 0.4 for o in varied)
    small = max(o.radius * o.extent for o in varied if o.size == "small")
    big = min(o.radius * o.extent for o in varied if o.size == "big")
    assert small < big  # the size classes stay apart
    rng = random.Random(4)
    glyphs = [
        g for g in (sample_scene(rng, replace(TRAIN_SPEC, glyph_prob=1.0)).glyph for _ in range(200)) if g
    ]
    slanted = [g for g in glyphs if g.shear != 0.0]
    assert (
        len(slanted) > 100 and max(g.shear for g in slanted) > 0.2 and min(g.stretch for g in slanted) < 0.8
    )


def test_the_legacy_share_is_drawn_in_the_first_look() -> None:
    rng = random.Random(5)
    scenes = [sample_scene(rng, TRAIN_SPEC) for _ in range(400)]
    first_look = [s for s in scenes if s.texture == "plain" and s.frame is None and s.font == "default"]
    first_look = [s for s in first_look if all(o.extent == 1.0 for o in s.objects)]
    assert 0.17 < len(first_look) / len(scenes) < 0.33


def test_eval_rows_draw_and_ask_nothing_of_the_augmentation() -> None:
    for row in evalrows.rows():
        for item in row.items:
            for obj in item.scene.objects:
                assert {k: getattr(obj, k) for k in DRAWING_DEFAULTS} == DRAWING_DEFAULTS, row.name
            if item.scene.glyph is not None:
                assert {k: getattr(item.scene.glyph, k) for k in GLYPH_DEFAULTS} == GLYPH_DEFAULTS
            assert all(
                t.family not in {"unknown/noun", "unknown/plural", "unknown/attribute"} for t in item.turns
            )


def _glyph_scene(glyph: Glyph) -> Scene:
    return Scene(400, 300, (240, 240, 240), (0.0, 0.0), 0.0, (), glyph, "png", 90)


def test_a_slanted_glyph_is_drawn_inside_its_box_and_labelled_in_its_cell() -> None:
    upright = Glyph("B", (2, 1), (10, 10, 10))
    for shear, stretch, angle in ((0.3, 0.7, 6.0), (-0.3, 1.15, -6.0)):
        glyph = replace(upright, shear=shear, stretch=stretch, angle=angle)
        scene = _glyph_scene(glyph)
        ink = np.asarray(render.render(scene)).min(axis=2) < 128
        ys, xs = np.nonzero(ink)
        left, top, right, bottom = render.glyph_box(glyph, scene.width, scene.height)
        assert (
            left - 2 <= xs.min() and xs.max() <= right + 2 and top - 2 <= ys.min() and ys.max() <= bottom + 2
        )
        assert xs.max() - xs.min() > 10  # something was drawn
        assert not np.array_equal(ink, np.asarray(render.render(_glyph_scene(upright))).min(axis=2) < 128)
        assert labels.glyph_token(scene, 3, 3) == 1 * 3 + 2  # row 1, column 2


def test_default_drawing_fields_draw_the_first_models_polygons() -> None:
    for shape in ("square", "triangle", "star", "cross"):
        obj = Obj(shape, "red", "big", (1, 1), 0.0, 0.0, 0.4, (200, 0, 0))
        assert render.object_polygon(obj, 50.0, 50.0, 20.0) == render.polygon(shape, 50.0, 50.0, 20.0)
        turned = render.object_polygon(replace(obj, angle=10.0), 50.0, 50.0, 20.0)
        assert turned != render.polygon(shape, 50.0, 50.0, 20.0)


def test_compositional_unknowns_hold_no_held_out_topic_word() -> None:
    rng = random.Random(6)
    families: set[str] = set()
    for _ in range(3000):
        question, family = grammar.compositional_unknown(rng, "the red circle")
        families.add(family)
        if family in {"unknown/noun", "unknown/plural", "unknown/attribute", "unknown/whole"}:
            words = re.findall(r"[a-z]+", question.lower())
            assert not any(
                held in word for held in pb.HELD_OUT_WORDS for word in words if word not in FRAME_WORDS
            )
    assert {"unknown/noun", "unknown/plural", "unknown/attribute", "unknown/whole"} <= families
    made_up = {grammar.made_up_word(rng) for _ in range(500)}
    assert len(made_up) > 400 and all(3 <= len(w) <= 8 and w.isalpha() for w in made_up)
    assert not any(held in word for held in pb.HELD_OUT_WORDS for word in made_up)


def test_training_asks_compositional_unknowns_and_the_eval_styles_do_not() -> None:
    assert dialogue.TRAINING.compositional_unknowns
    assert not dialogue.PLAIN.compositional_unknowns and not dialogue.HELD_OUT_FAMILIES.compositional_unknowns
    rng = random.Random(7)
    scene = sample_scene(rng, TRAIN_SPEC)
    while not scene.objects:
        scene = sample_scene(rng, TRAIN_SPEC)
    turns = [dialogue.ask_unknown(scene, rng, grammar.Split.TRAIN, compositional=True) for _ in range(200)]
    assert all(t.answer == pb.CANNOT_TELL for t in turns)
    assert sum(t.family == "unknown/attribute" for t in turns) > 20


def test_fillers_are_stray_words_that_keep_the_question_and_its_answer() -> None:
    rng = random.Random(9)
    question = "What colour is the red circle?"
    filled = [grammar.with_filler(question, rng) for _ in range(200)]
    assert all("the red circle" in f and f != question for f in filled)
    assert sum(f.endswith("?") for f in filled) == len(filled)
    words = {re.findall(r"[a-z]+", f.lower().replace("what colour is the red circle", ""))[0] for f in filled}
    assert len(words) > 100 and not words & {"red", "circle", "colour", "left", "right", "big", "small"}
    assert 0.08 < dialogue.TRAINING.filler_share < 0.2 and dialogue.PLAIN.filler_share == 0.0


def test_the_unknown_weight_sets_the_share_of_cannot_tell_questions() -> None:
    """``SceneSpec.unknown_weight`` (``tinyvlm.train --unknown-weight``): none at 0, about half as
    many at half the default, and the default spec draws exactly as before (None: TRAINING's)."""

    def unknown_share(spec: object) -> float:
        turns = [t for i in range(300) for t in data.training_conversation(5, i, spec)[1]]  # type: ignore[arg-type]
        return sum(t.answer == pb.CANNOT_TELL for t in turns) / len(turns)

    default = unknown_share(TRAIN_SPEC)
    assert default == unknown_share(replace(TRAIN_SPEC, unknown_weight=dialogue.TRAINING.unknown_weight))
    assert unknown_share(replace(TRAIN_SPEC, unknown_weight=0.0)) == 0.0
    half = unknown_share(replace(TRAIN_SPEC, unknown_weight=dialogue.TRAINING.unknown_weight / 2))
    assert 0.3 * default < half < 0.75 * default
