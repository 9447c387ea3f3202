"""M-RoPE positions in a few tensor ops (``services/engine/mrope.py``) against the model's own
``get_rope_index``, on many random prompts, for the bundled model and the tiny random Qwen2-VL."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from services.engine.api import ImageInput
from services.engine.architectures import Architecture
from services.engine.mrope import grid_positions


def random_prompt(rng: np.random.Generator, tok: int, merge: int) -> tuple[list[int], list[ImageInput]]:
    """Text, then one to three images of random grids, each followed by text (or not, the last)."""

    def text(n: int) -> list[int]:
        return [tok + 1 + int(x) for x in rng.integers(0, 100, n)]

    grids = [[1, merge * int(rng.integers(1, 12)), merge * int(rng.integers(1, 12))] for _ in range(3)]
    grids = grids[: int(rng.integers(1, 4))]
    ids = text(int(rng.integers(1, 30)))
    for i, (t, h, w) in enumerate(grids):
        ids += [tok] * (t * (h // merge) * (w // merge)) + text(
            int(rng.integers(0 if i == len(grids) - 1 else 1, 10))
        )
    return ids, [ImageInput(torch.zeros(0), torch.tensor([g]), "") for g in grids]


@pytest.mark.parametrize("name", ["bundled", "qwen2_vl"])
def test_positions_equal_get_rope_index(name: str, bundled: Any, tiny_models: Any) -> None:
    model, processor = bundled if name == "bundled" else tiny_models[name]
    arch = Architecture(model, processor)
    assert arch.quick_positions, f"{name}: the probe at load did not match get_rope_index"
    rng = np.random.default_rng(3)
    for _ in range(200):
        ids, images = random_prompt(rng, arch.image_token_id, arch.merge)
        assert torch.equal(arch.positions(ids, images), arch._rope_index(ids, images))


def test_a_prompt_outside_the_rule_is_left_to_get_rope_index() -> None:
    """Two images' tokens side by side are one run: no positions (the caller asks the model)."""
    tok = 7
    ids = [1, *[tok] * 4, *[tok] * 2, 2]
    assert grid_positions(ids, [[1, 4, 4], [1, 2, 4]], tok, 2) is None
    assert grid_positions([1, *[tok] * 4, 2], [[1, 4, 4], [1, 2, 4]], tok, 2) is None  # a grid unused
    assert grid_positions([1, *[tok] * 3, 2], [[1, 4, 4]], tok, 2) is None  # a run of the wrong size
    assert grid_positions([1, *[tok] * 8, 2], [[2, 4, 4]], tok, 2) is None  # two frames: the model's rule
