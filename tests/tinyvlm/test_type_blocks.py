"""Blocked batches: which conversations a block draws, how its answers are weighted, the loss."""

import torch

from tinyvlm import data, objective
from tinyvlm.type_blocks import Block, answer_weights, block_at, blocked_plan

SKIP = data.IGNORE
TEXT = (Block(0.5, 1.0, ("text",)),)


def test_steps_inside_a_block_draw_only_conversations_asking_its_type() -> None:
    types = [["colour"], ["text", "size"], ["count"], ["shape", "text"], ["text"]]
    plan = [[0, 1]] * 10
    out = blocked_plan(plan, types, first=100, blocks=TEXT, seed=0)
    assert out[:5] == plan[:5]  # before the block: untouched
    assert all(set(batch) <= {101, 103, 104} for batch in out[5:])
    assert out == blocked_plan(plan, types, first=100, blocks=TEXT, seed=0)  # seeded


def test_a_block_with_too_few_conversations_keeps_the_plan() -> None:
    plan = [[0, 1, 2]] * 4
    assert blocked_plan(plan, [["text"], ["colour"], ["size"]], first=0, blocks=TEXT, seed=0) == plan


def test_block_at_covers_start_not_end() -> None:
    assert block_at(4, 10, TEXT) is None
    assert block_at(5, 10, TEXT) == TEXT[0]
    assert block_at(9, 10, TEXT) == TEXT[0]


def test_answers_of_the_focused_type_weigh_one_others_less_nothing_else_counts() -> None:
    labels = torch.tensor([SKIP, 5, 2, SKIP, SKIP, 7, 2, SKIP, 8, 9, 2])
    weights = answer_weights(labels, ["colour", "text", "count"], ("text",), off=0.2)
    expected = [0, 0.2, 0.2, 0, 0, 1, 1, 0, 0.2, 0.2, 0.2]
    assert torch.allclose(weights, torch.tensor(expected))


def test_weighted_loss_with_equal_weights_is_the_plain_loss() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 6, 11)
    gold = torch.tensor([[SKIP, 3, 4, SKIP, 5, 2], [SKIP, SKIP, 1, 2, SKIP, SKIP]])
    ones = (gold != SKIP).float()
    plain = objective._next_token_loss(logits, gold)
    assert torch.allclose(objective._next_token_loss(logits, gold, ones * 3.0), plain)
    only_first = ones.clone()
    only_first[1] = 0  # the second row's answers weigh nothing
    first_row = objective._next_token_loss(logits[:1], gold[:1])
    assert torch.allclose(objective._next_token_loss(logits, gold, only_first), first_row)
