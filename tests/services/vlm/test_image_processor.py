"""The image processor split at its resize: the decode worker's uint8 picture, finished by the
inference worker, is the processor's own output bit for bit, for every architecture the engine
serves; a processor that cannot be split ships its whole output."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from PIL import Image

from bench.common import build_model
from services.vlm.image_processor import RESIZED, ImageProcessorHandle
from tests.support import models
from tests.support.jobs import image_bytes
from worker.imaging import decode_image


def processors() -> dict[str, Any]:
    found = {"bundled": ImageProcessorHandle.load(models.test_model_path()).processor}
    for family in ("glm4v", "qwen2_vl", "llava"):
        found[family] = build_model(family)[1].image_processor
    return found


@pytest.mark.parametrize("name", ["bundled", "glm4v", "qwen2_vl", "llava"])
def test_the_split_is_exact(name: str) -> None:
    handle = ImageProcessorHandle.wrap(processors()[name])
    assert handle.split, f"{name}: the processor's work does not split after its resize"
    assert handle.direct is not None, f"{name}: finish is not one _preprocess call"  # what from_wire runs
    assert handle.direct_resize is not None, f"{name}: resize is not one _preprocess call"  # wire's
    for seed, (fmt, size) in enumerate([("JPEG", (333, 222)), ("PNG", (64, 300)), ("WEBP", (1024, 700))]):
        img = decode_image(image_bytes(fmt, size, seed=seed), 10**8, handle.target_pixels)
        wire = handle.wire(img)
        assert set(wire) == {RESIZED} and wire[RESIZED].dtype == torch.uint8
        whole, finished = handle(img), handle.from_wire(wire)
        assert whole.keys() == finished.keys()
        assert all(torch.equal(whole[k], finished[k]) for k in whole), (name, fmt, size)
        assert torch.equal(wire[RESIZED], torch.from_numpy(_whole_call_resize(handle, img)))


def _whole_call_resize(handle: ImageProcessorHandle, img: Image.Image) -> Any:
    slow = copy.copy(handle)
    slow.direct_resize = None
    return slow.resize(img)


def test_resize_is_the_whole_call_where_inputs_are_prepared_otherwise() -> None:
    """A processor that changes the pictures before its ``_preprocess`` (here: mirrors those it
    will resize) resizes through its whole call: the probes at load see the difference."""
    base = ImageProcessorHandle.load(models.test_model_path()).processor

    class Mirroring(type(base)):  # type: ignore[misc]
        def _prepare_image_like_inputs(self, images: Any, *args: Any, **kwargs: Any) -> Any:
            prepared = super()._prepare_image_like_inputs(images, *args, **kwargs)
            return [image[..., ::-1].copy() for image in prepared] if kwargs.get("do_resize") else prepared

    processor = copy.copy(base)
    processor.__class__ = Mirroring
    handle = ImageProcessorHandle.wrap(processor)
    assert handle.split and handle.direct_resize is None
    img = Image.fromarray(torch.randint(0, 256, (90, 200, 3), dtype=torch.uint8).numpy())
    assert torch.equal(handle.from_wire(handle.wire(img))["pixel_values"], handle(img)["pixel_values"])


def test_finish_is_the_whole_call_where_one_step_cannot_be_set_up() -> None:
    """A processor whose ``_preprocess`` takes an option it keeps no setting for finishes through its
    whole call (which fills the option's default), and that is still exact."""
    base = ImageProcessorHandle.load(models.test_model_path()).processor

    class StepWithAnOption(type(base)):  # type: ignore[misc]
        def _preprocess(self, images: Any, tile_overlap: int = 0, **kwargs: Any) -> Any:
            return super()._preprocess(images, **kwargs)

    processor = copy.copy(base)
    processor.__class__ = StepWithAnOption
    handle = ImageProcessorHandle.wrap(processor)
    assert handle.split and handle.direct is None
    img = Image.new("RGB", (300, 200), (10, 200, 30))
    assert torch.equal(handle.from_wire(handle.wire(img))["pixel_values"], handle(img)["pixel_values"])


def test_a_processor_that_does_not_resize_ships_its_whole_output() -> None:
    processor = ImageProcessorHandle.load(models.test_model_path()).processor
    processor.do_resize = False  # nothing to split at: the whole output travels (float16)
    handle = ImageProcessorHandle.wrap(processor)
    img = Image.new("RGB", (168, 168), (10, 200, 30))
    assert not handle.split
    wire = handle.wire(img)
    assert "pixel_values" in wire and RESIZED not in wire
    assert torch.equal(handle.from_wire(wire)["pixel_values"], handle(img)["pixel_values"])


@pytest.mark.parametrize("name", ["bundled", "glm4v", "qwen2_vl", "llava"])
def test_the_pixel_budget_is_what_the_resize_keeps(name: str) -> None:
    """``target_pixels`` (draft decoding's aim) is the resize's output area for a picture over the
    budget, never more: GLM-4V's configured budget counts two frames, twice what it keeps. A draft-
    decoded JPEG still reaches the resize at least as large as its output on both axes."""
    handle = ImageProcessorHandle.wrap(processors()[name])
    out = handle.resize(Image.new("RGB", (1500, 1100), (90, 90, 90)))
    if handle.target_pixels is None:  # a processor without a pixel budget: no draft aim at all
        assert name == "llava"
        return
    _c, height, width = out.shape
    # at least what it keeps; above it only by the rounding to patch multiples, never twice it
    assert height * width <= handle.target_pixels < 1.5 * height * width, name
    data = image_bytes("JPEG", (1500, 1100), seed=5)
    img = decode_image(data, 10**8, handle.target_pixels)
    assert img.width >= width and img.height >= height and img.width < 1500, (name, img.size)
