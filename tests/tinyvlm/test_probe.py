"""The encoder probe: it sees the picture the labels describe, and every encoder trains and reports."""

import random

import pytest
import torch
import torch.nn.functional as F

from tinyvlm import build, data, distil, probe, questions
from tinyvlm.scene import Obj, Scene, sample_scene


@pytest.fixture(scope="module")
def processor() -> object:
    return build.build_processor()


def test_image_tensor_puts_the_patches_back_in_picture_order(processor: object) -> None:
    red_circle_top_left = Obj("circle", "red", "big", (0, 0), 0.0, 0.0, 0.44, (220, 30, 30))
    scene = Scene(280, 280, (240, 240, 240), (0.0, 0.0), 0.0, (red_circle_top_left,), None, "png", 90)
    example = data.make_example(processor, scene, questions.conversation(scene, random.Random(0)), seed=0)
    image = probe.image_tensor(example)
    _, h, w = example.grid_thw.tolist()
    assert image.shape == (3, h * 14, w * 14)
    centre = image[:, image.shape[1] // 6, image.shape[2] // 6]  # the middle of the top-left cell
    corner = image[:, -4, -4]
    assert centre[0] > 0.7 and centre[1] < 0.3 and centre[2] < 0.3  # red
    assert (corner > 0.85).all()  # background


@pytest.fixture(scope="module")
def examples(processor: object) -> list[data.Example]:
    out = []
    for i in range(8):
        rng = random.Random(i)
        scene = sample_scene(rng)
        out.append(data.make_example(processor, scene, questions.conversation(scene, rng), seed=i))
    return out


@pytest.mark.parametrize("encoder", probe.ENCODERS)
def test_every_encoder_trains_and_reports_per_attribute_accuracy(
    processor: object, examples: list[data.Example], encoder: str
) -> None:
    reports = probe.run(probe.make_probe(encoder, processor), steps=2, lr=1e-3, examples=examples, batch=2)
    last = reports[-1]
    assert last["step"] == 2 and torch.isfinite(torch.tensor(last["loss"]))
    assert set(probe.READ_OUT) <= set(last)
    assert all(0.0 <= last[name] <= 100.0 for name in probe.READ_OUT)


def test_tower_order_matches_the_towers_patch_order(processor: object, examples: list[data.Example]) -> None:
    # The cached pixels are in the tower's patch order; put back in picture order and re-ordered,
    # each patch's mean colour must land on its own row.
    example = examples[0]
    picture = probe.image_tensor(example)
    patch_means = F.avg_pool2d(picture[None], build.PATCH)[0]  # (3, h, w)
    ordered = distil.tower_order(patch_means, example.grid_thw)
    assert torch.allclose(ordered, example.pixels.float().mean(dim=(2, 3)) / 255.0, atol=1e-5)


def test_feature_matching_trains_the_tower_and_leaves_the_teacher_alone(
    processor: object, examples: list[data.Example]
) -> None:
    teacher, _ = probe.make_probe("cnn", processor)
    tower, heads = probe.make_probe("vit", processor)
    assert isinstance(teacher, probe.ConvEncoder) and isinstance(tower, probe.VisionTower)
    match = distil.FeatureMatch(teacher, tower, block=1)
    batch = examples[:2]
    loss = match(batch, tower(batch))
    loss.backward()
    assert loss.item() > 0
    assert all(p.grad is None for p in teacher.parameters())
    first_block = tower.visual.blocks[0].mlp.down_proj.weight.grad
    assert first_block is not None and first_block.abs().sum() > 0
    reports = probe.run((tower, heads), steps=2, lr=1e-3, examples=examples, batch=2, extra_loss=match)
    assert reports[-1]["step"] == 2 and torch.isfinite(torch.tensor(reports[-1]["loss"]))
    assert all(p.grad is None for p in teacher.parameters())
