"""The encoder probe: it sees the picture the labels describe, and every encoder trains and reports."""

import random

import pytest
import torch

from tinyvlm import build, data, probe, questions
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
    assert image.shape == (3, h * build.PATCH, w * build.PATCH)
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
