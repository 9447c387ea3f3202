"""Pointer targets sit on the right tokens and name the right image tokens; the loss reads the
attention of the pointer heads."""

import random

import pytest
import torch

from tinyvlm import build, data, objective, pointers, questions
from tinyvlm.questions import Mention, Turn
from tinyvlm.scene import Glyph, Obj, Scene, sample_scene

STAR = Obj("star", "red", "small", (2, 0), 0.0, 0.0, 0.25, (220, 30, 30))
CIRCLE = Obj("circle", "blue", "big", (0, 2), 0.0, 0.0, 0.42, (30, 70, 220))
SCENE = Scene(
    300, 300, (240, 240, 240), (0.0, 0.0), 0.0, (STAR, CIRCLE), Glyph("7", (1, 1), (15, 15, 15)), "png", 90
)
# Slots: 0 is the image's start token, then the 3x3 cells row-major from 1.
STAR_SLOT, CIRCLE_SLOT, GLYPH_SLOT = 3, 7, 5


def _pointers() -> list[tuple[str, int, int, tuple[int, ...]]]:
    turns = [
        Turn("What colour is the star?", "red", "colour", False, False, (Mention("the star", STAR),), STAR),
        Turn("And its size?", "small", "size", True, False, about=STAR),
        Turn("How many circles are there?", "1", "count", False, False, counted=(CIRCLE,)),
        Turn("What is written in the picture?", "7", "text", False, False),
        Turn(
            "Is the blue circle left or right of the star?",
            "left",
            "relative",
            False,
            False,
            (Mention("the blue circle", CIRCLE), Mention("the star", STAR)),
            CIRCLE,
        ),
    ]
    tokenizer = build.build_processor().tokenizer
    text = tokenizer.apply_chat_template(data.messages(turns), tokenize=False)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    tokens = enc.tokens()
    found = pointers.pointers(text, enc["offset_mapping"], turns, SCENE, 3, 3)
    return [(tokens[p.position], p.layer, p.head, p.slots) for p in found]


def test_references_and_unnamed_questions_point_at_their_image_tokens() -> None:
    mention, answer = pointers.MENTION_LAYER, pointers.ANSWER_LAYER
    assert _pointers() == [
        ("Ġstar", mention, 0, (STAR_SLOT,)),
        ("<|assistant|>", answer, 0, (STAR_SLOT,)),
        ("<|assistant|>", answer, 0, (STAR_SLOT,)),  # the follow-up: the same object
        ("?", mention, 0, (0, CIRCLE_SLOT)),  # a count: the counted objects and the start token
        ("<|assistant|>", answer, 0, (0, CIRCLE_SLOT)),
        ("?", mention, 0, (GLYPH_SLOT,)),
        ("<|assistant|>", answer, 0, (GLYPH_SLOT,)),
        ("Ġcircle", mention, 0, (CIRCLE_SLOT,)),
        ("Ġstar", mention, 0, (STAR_SLOT,)),
        ("<|assistant|>", answer, 0, (CIRCLE_SLOT,)),  # left/right: the object asked about...
        ("<|assistant|>", answer, 1, (STAR_SLOT,)),  # ...and the one it is compared with
    ]


@pytest.fixture(scope="module")
def processor() -> object:
    return build.build_processor()


def test_pointer_loss_is_low_exactly_when_the_heads_look_where_told(processor: object) -> None:
    rng = random.Random(3)
    examples = []
    for i in range(2):
        scene = sample_scene(rng)
        examples.append(
            data.make_example(processor, scene, questions.conversation(scene, rng, n_turns=4), seed=i)
        )
    batch = data.collate(examples, processor, 1)
    length = batch["input_ids"].shape[1]
    prefix = 10
    attention = torch.full((2, 4, length - prefix, length), 1.0 / length)
    uniform = objective.pointer_loss(
        objective.Forward(torch.zeros(0), prefix, None, {1: attention, 3: attention}), batch
    )
    told = attention.clone()
    for row, position, head, target in zip(
        batch["pointer_batch_rows"],
        batch["pointer_positions"],
        batch["pointer_heads"],
        batch["pointer_targets"],
        strict=True,
    ):
        told[row, head, position - prefix] = 0.0
        told[row, head, position - prefix, batch["image_keys"][row]] = target
    right = objective.pointer_loss(objective.Forward(torch.zeros(0), prefix, None, {1: told, 3: told}), batch)
    assert uniform > 3.0 and right < uniform - 2.0
