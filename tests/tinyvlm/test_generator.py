"""Scenes, conversations and renderings: seeded, consistent with the picture, varied."""

import io
import random
from collections import Counter
from dataclasses import replace

from PIL import Image

from tinyvlm import render, templates, vocab
from tinyvlm.data import training_conversation
from tinyvlm.evalsets import HELDOUT, WIDE, client_image, items
from tinyvlm.questions import conversation
from tinyvlm.scene import TRAIN_SPEC, WIDE_SPEC, sample_scene


def test_same_seed_same_conversation() -> None:
    a, b = random.Random(5), random.Random(5)
    sa, sb = sample_scene(a), sample_scene(b)
    assert sa == sb
    assert conversation(sa, a) == conversation(sb, b)


def test_scene_ranges() -> None:
    rng = random.Random(0)
    counts: dict[str, set[int]] = {"train": set(), "wide": set()}
    for name, spec in (("train", TRAIN_SPEC), ("wide", WIDE_SPEC)):
        for _ in range(200):
            s = sample_scene(rng, spec)
            assert 96 <= s.width <= 1024 and 96 <= s.height <= 1024
            counts[name].add(len(s.objects))
            cells = [o.cell for o in s.objects] + ([s.glyph.cell] if s.glyph else [])
            assert len(set(cells)) == len(cells)  # one thing per grid cell
    # Training draws every object count the issue asks for; the wide set only the crowded ones.
    assert counts["train"] == set(range(1, vocab.MAX_OBJECTS + 1))
    assert counts["wide"] == {4, 5, 6}


def test_answers_match_scene() -> None:
    rng = random.Random(1)
    for _ in range(300):
        scene = sample_scene(rng)
        for turn in conversation(scene, rng):
            if turn.question in ("How many shapes are there?", "Count the shapes."):
                assert turn.answer == str(len(scene.objects))
            if turn.qtype == "text":
                assert scene.glyph is not None and turn.answer == scene.glyph.char
            if turn.qtype == "colour":
                assert turn.answer in vocab.COLOURS


def test_training_never_sees_held_out_phrasings() -> None:
    rng = random.Random(2)
    held_out = {options[-1] for options in templates.PHRASINGS.values()}
    held_out |= {options[-1] for options in templates.FOLLOW_UPS.values()}
    for _ in range(300):
        for turn in conversation(sample_scene(rng), rng, held_out=False):
            assert not turn.held_out_phrasing
            assert turn.question not in held_out


def test_polish_set_repeats_attributes_and_drills_without_held_out_phrasings() -> None:
    polish = replace(TRAIN_SPEC, repeat=0.5, drills=True)
    repeats, relative_refs, left_right, capitals = 0, 0, Counter[str](), 0
    conditional_counts: Counter[str] = Counter()
    for index in range(200):
        scene, turns = training_conversation(99, index, polish)
        colours = [o.colour for o in scene.objects]
        repeats += len(colours) > len(set(colours))
        assert not any(turn.held_out_phrasing for turn in turns)
        relative_refs += sum(turn.qtype != "relative" and " of the " in turn.question for turn in turns)
        left_right.update(turn.family for turn in turns[-5:] if turn.qtype == "relative")
        capitals += sum(turn.question.isupper() for turn in turns[-4:])  # drills typed as people type
        one_kind, total = turns[-2:]
        assert total.qtype == "count" and total.answer == str(len(scene.objects))
        assert one_kind.qtype == "count" and one_kind.answer == str(len(one_kind.counted))
        assert "shapes" not in one_kind.question or any(c in one_kind.question for c in vocab.COLOURS)
        conditional_counts[one_kind.answer] += 1
    assert repeats > 60 and relative_refs > 100
    # Left/right and above/below drills: two in the first model's phrasings, one in people's words.
    assert left_right["legacy"] > 240 and sum(left_right.values()) - left_right["legacy"] > 120
    assert capitals > 20
    assert conditional_counts["2"] > 20 and conditional_counts["3"] > 5


def test_eval_sets_cover_types_turns_and_held_out_phrasings() -> None:
    heldout = list(items(HELDOUT))
    turns = [t for item in heldout for t in item.turns]
    assert len(turns) >= 2000
    assert set(Counter(t.qtype for t in turns)) == {
        "shape",
        "colour",
        "size",
        "position",
        "count",
        "relative",
        "text",
    }
    assert any(t.held_out_phrasing for t in turns)
    assert max(len(item.turns) for item in heldout) == 3
    assert any("color" in t.question for t in turns) and any("colour" in t.question for t in turns)
    wide = list(items(WIDE, 200))
    assert sum(len(i.scene.objects) for i in wide) / len(wide) > 4.5


def test_client_image_has_scene_size_and_format() -> None:
    item = next(items(HELDOUT))
    image = client_image(item)
    assert image.size == (item.scene.width, item.scene.height)
    small = render.render(item.scene, 0.25)
    assert abs(small.width - item.scene.width * 0.25) <= 1


def test_round_trip_gives_what_a_client_file_decodes_to() -> None:
    rng = random.Random(4)
    for _ in range(6):
        scene = sample_scene(rng)
        image = render.render(scene, 0.3, seed=1)
        decoded = Image.open(io.BytesIO(render.encode(image, scene))).convert("RGB")
        assert render.round_trip(image, scene).tobytes() == decoded.tobytes()
