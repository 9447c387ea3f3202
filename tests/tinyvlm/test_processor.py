"""vlmq-tiny's processor: every picture becomes the same 3x3 token grid, and it saves and loads
by name through the Auto classes like any checkpoint's processor."""

from pathlib import Path

import pytest
from PIL import Image
from transformers import AutoImageProcessor, AutoProcessor

import services  # noqa: F401  (registers the processor classes, as every client does)
from services.vlm.registration import VlmqGlm4vImageProcessor, VlmqGlm4vProcessor
from tinyvlm import build

SIZES = [(96, 96), (300, 200), (190, 96), (1024, 1024), (2000, 1500), (97, 1003)]


@pytest.mark.parametrize("size", SIZES)
def test_any_picture_size_gives_one_token_per_grid_cell(size: tuple[int, int]) -> None:
    processor = build.build_processor()
    text = "<|user|><|begin_of_image|><|image|><|end_of_image|>Hi<|assistant|>"
    inputs = processor(text=[text], images=[Image.new("RGB", size, "white")], return_tensors="pt")
    assert inputs["image_grid_thw"].tolist() == [[1, 2 * build.GRID, 2 * build.GRID]]
    assert int((inputs["input_ids"][0] == processor.image_token_id).sum()) == build.GRID**2
    assert inputs["pixel_values"].shape == (4 * build.GRID**2, 3 * 2 * build.PATCH**2)


def test_the_square_is_the_whole_picture_squeezed_not_cropped() -> None:
    # Left half red, right half blue, in a 2:1 picture: the left column of patches stays red.
    picture = Image.new("RGB", (400, 200), (0, 0, 255))
    picture.paste((255, 0, 0), (0, 0, 200, 200))
    values = build.build_image_processor()(images=[picture], return_tensors="np")["pixel_values"]
    patches = values.reshape(-1, 3, 2, build.PATCH, build.PATCH)
    first, last = patches[0, :, 0].mean(axis=(1, 2)), patches[-1, :, 0].mean(axis=(1, 2))
    assert first[0] > first[2] and last[2] > last[0]  # red top left, blue bottom right


def test_saves_and_loads_by_name(tmp_path: Path) -> None:
    build.build_processor().save_pretrained(tmp_path)
    processor = AutoProcessor.from_pretrained(tmp_path)
    assert isinstance(processor, VlmqGlm4vProcessor)
    image_processor = AutoImageProcessor.from_pretrained(tmp_path)
    assert isinstance(image_processor, VlmqGlm4vImageProcessor)
    assert image_processor.square_side == build.SIDE


def test_without_square_side_it_resizes_like_glm4v() -> None:
    stock = VlmqGlm4vImageProcessor(patch_size=14, merge_size=2, temporal_patch_size=2)
    out = stock(images=[Image.new("RGB", (560, 280))], return_tensors="np")
    assert out["image_grid_thw"].tolist() == [[1, 20, 40]]  # the aspect ratio kept


def test_a_square_side_off_the_token_grid_is_refused() -> None:
    bad = VlmqGlm4vImageProcessor(square_side=100, patch_size=28, merge_size=2, temporal_patch_size=2)
    with pytest.raises(ValueError, match="not a multiple"):
        bad(images=[Image.new("RGB", (120, 120))])
