"""Referent targets sit on the right tokens; the recency window and the read-out head behave."""

import torch

from tinyvlm import build, data, referents, vocab
from tinyvlm.questions import Mention, Turn
from tinyvlm.scene import Obj

STAR = Obj("star", "red", "small", (2, 0), 0.0, 0.0, 0.2, (220, 30, 30))
CIRCLE = Obj("circle", "blue", "big", (0, 2), 0.0, 0.0, 0.4, (30, 70, 220))


def _turns() -> list[Turn]:
    return [
        Turn("What colour is the star?", "red", "colour", False, False, (Mention("the star", STAR),), STAR),
        Turn("And its size?", "small", "size", True, False, about=STAR),
        Turn("How many circles are there?", "1", "count", False, False),
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


def _tokens_and_targets() -> tuple[list[str], list[int], list[list[int]]]:
    tokenizer = build.build_processor().tokenizer
    text = tokenizer.apply_chat_template(data.messages(_turns()), tokenize=False)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    positions, rows = referents.targets(text, enc["offset_mapping"], _turns())
    return tokenizer.convert_ids_to_tokens(enc["input_ids"]), positions, rows


def test_each_reference_end_carries_its_object_and_unnamed_questions_their_end() -> None:
    tokens, positions, rows = _tokens_and_targets()
    at = [tokens[p] for p in positions]
    # "the star" | follow-up "And its size?" | count | both references of the left/right question
    assert at == ["Ġstar", "?", "?", "Ġcircle", "Ġstar"]
    star = referents.object_row(STAR)
    assert rows[0] == star and rows[1] == star
    assert rows[3] == referents.object_row(CIRCLE)
    # the later reference of the left/right question: the circle lies left of and below the star
    across, along = referents.COLUMNS.index("across"), referents.COLUMNS.index("along")
    assert rows[4][across] == 0 and rows[4][along] == 1
    assert rows[4][:4] == star[:4]
    count = referents.COLUMNS.index("count")
    assert rows[2][count] == 1 and all(v == referents.IGNORE for i, v in enumerate(rows[2]) if i != count)
    assert star[:4] == [
        0,
        vocab.SHAPES.index("star"),
        vocab.SIZES.index("small"),
        sorted(vocab.CELL_NAMES).index((2, 0)),
    ]


def test_the_anchor_of_a_relative_reference_points_at_the_referred_cell() -> None:
    tokenizer = build.build_processor().tokenizer
    circle_left_of_star = Obj("circle", "blue", "big", (1, 0), 0.0, 0.0, 0.4, (30, 70, 220))
    turn = Turn(
        "What colour is the shape left of the star?",
        "blue",
        "colour",
        False,
        False,
        (Mention("the star", STAR),),
        circle_left_of_star,
    )
    text = tokenizer.apply_chat_template(data.messages([turn]), tokenize=False)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    positions, rows = referents.targets(text, enc["offset_mapping"], [turn])
    assert [enc.tokens()[p] for p in positions] == ["Ġstar"]
    assert rows[0][:4] == referents.object_row(STAR)[:4]
    assert rows[0][referents.COLUMNS.index("pointed_cell")] == sorted(vocab.CELL_NAMES).index((1, 0))


def test_recency_heads_start_looking_at_the_last_tokens() -> None:
    processor = build.build_processor()
    model = build.build_model(processor.tokenizer, seed=0)
    referents.recency_heads(model, (0, 1), window=8.0)
    model.config._attn_implementation = "eager"
    ids = processor.tokenizer("Tell me what is written. " * 12, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model(input_ids=ids, output_attentions=True)
    last = out.attentions[0][0, :, -1]  # heads x keys, at the last position
    recent = last[:, -10:].sum(-1)
    assert (recent[:2] > 0.8).all()  # the window heads
    assert (recent[2:] < 0.3).all()  # the others still spread out


def test_referent_head_scores_only_the_asked_columns() -> None:
    head = referents.ReferentHead(16)
    hidden = torch.randn(2, 16, requires_grad=True)
    rows = torch.tensor([referents.object_row(STAR), [referents.IGNORE] * len(referents.COLUMNS)])
    rows[1, referents.COLUMNS.index("glyph")] = 3
    loss = head.loss(hidden, rows)
    loss.backward()
    assert torch.isfinite(loss) and hidden.grad is not None and hidden.grad.abs().sum() > 0
    assert float(head.loss(hidden, rows[:0])) == 0.0
