"""The crop stage: crops show the object they are labelled with, local attention starts local, and
the tower trains on crops."""

import dataclasses
import random

import pytest
import torch

from tinyvlm import build, crops, data, probe, questions, vocab
from tinyvlm.scene import Obj, Scene, sample_scene


@pytest.fixture(scope="module")
def processor() -> object:
    return build.build_processor()


def test_a_crop_shows_its_object_and_carries_its_labels(processor: object) -> None:
    blue_square = Obj("square", "blue", "big", (2, 1), 0.0, 0.0, 0.4, vocab.COLOURS["blue"])
    scene = Scene(336, 336, (240, 240, 240), (0.0, 0.0), 0.0, (blue_square,), None, "png", 95)
    example = data.make_example(processor, scene, questions.conversation(scene, random.Random(0)), seed=0)
    [crop] = crops.crops(example, processor)
    assert crop.targets.tolist() == [vocab.SHAPES.index("square"), list(vocab.COLOURS).index("blue"), 1]
    assert crop.values.shape[0] == crops.SIDE * crops.SIDE
    # Back to pixels: the crop's middle is blue and its corner is background.
    picture = probe.image_tensor(_as_example(example, crop, processor))
    middle = picture[:, picture.shape[1] // 2, picture.shape[2] // 2]
    assert middle[2] > 0.6 and middle[0] < 0.4
    assert (picture[:, 1, 1] > 0.85).all()


def _as_example(example: data.Example, crop: crops.Crop, processor: object) -> data.Example:
    """The crop as an example of its own, so ``probe.image_tensor`` can draw it."""
    pixels = data._to_uint8_pixels(crop.values, processor)  # the cache's own encoding
    return dataclasses.replace(example, pixels=pixels, grid_thw=torch.tensor([1, crops.SIDE, crops.SIDE]))


def _tower_position(index: int, columns: int) -> tuple[int, int]:
    """(row, column) of the patch at ``index`` in the tower's order (merge x merge blocks, row-major)."""
    m = build.MERGE
    block, inside = divmod(index, m * m)
    block_row, block_column = divmod(block, columns // m)
    return block_row * m + inside // m, block_column * m + inside % m


def test_local_attention_makes_each_head_look_at_its_neighbour(processor: object) -> None:
    tower, _ = probe.make_probe("vit", processor)
    assert isinstance(tower, probe.VisionTower)
    visual = tower.visual
    crops.local_attention(visual)
    attention = visual.blocks[0].attn
    captured: dict[str, object] = {}
    attention.register_forward_pre_hook(lambda _m, _a, kwargs: captured.update(kwargs), with_kwargs=True)
    side, dim = 8, visual.config.hidden_size
    visual(
        torch.randn(side * side, 3 * 2 * build.PATCH * build.PATCH), grid_thw=torch.tensor([[1, side, side]])
    )
    # Positional attention only, values passed through: a one-hot input at patch j comes out at
    # patch i scaled by the attention i pays to j, separately per head.
    with torch.no_grad():
        attention.qkv.weight.zero_()
        attention.qkv.weight[2 * dim :] = torch.eye(dim)
        attention.proj.weight.copy_(torch.eye(dim))
        marker = torch.zeros(side * side, dim)
        target = next(k for k in range(side * side) if _tower_position(k, side) == (3, 3))
        marker[target] = 1.0
        out = attention(marker, **captured)
    head_dim = dim // visual.config.num_heads
    for head in range(visual.config.num_heads):
        paid = out[:, head * head_dim]  # attention each patch pays to the marked one
        looker = _tower_position(int(paid.argmax()), side)
        row_offset, column_offset = crops.LOCAL_OFFSETS[head % len(crops.LOCAL_OFFSETS)]
        assert looker == (3 - row_offset, 3 - column_offset), head
        assert 0.5 < float(paid.max()) < 1.0  # mostly, not only, on the neighbour


def test_the_tower_trains_on_crops(processor: object) -> None:
    examples = []
    for i in range(6):
        rng = random.Random(i)
        scene = sample_scene(rng)
        examples.append(data.make_example(processor, scene, questions.conversation(scene, rng), seed=i))
    all_crops = [c for e in examples for c in crops.crops(e, processor)]
    assert len(all_crops) >= 6
    tower, _ = probe.make_probe("vit", processor)
    assert isinstance(tower, probe.VisionTower)
    before = tower.visual.blocks[0].mlp.down_proj.weight.clone()
    crops.pretrain(tower.visual, all_crops[2:], all_crops[:2], steps=2, lr=1e-3, batch=4)
    assert not torch.equal(before, tower.visual.blocks[0].mlp.down_proj.weight)
