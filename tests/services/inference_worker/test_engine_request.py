"""JobSpec -> engine request mapping (pure functions)."""

from __future__ import annotations

import pytest
import torch

from services.inference_worker.engine_request import (
    build_request,
    chat_messages,
    image_input,
    pixels_input,
    sampling_params,
)
from services.vlm.image_processor import ImageProcessorHandle
from shared.schemas import ChatTurn, SamplingSpec
from shared.tensors import TensorCodecError, pack_image
from tests.support import models
from tests.support.jobs import image_bytes, make_spec
from tests.support.reference import decoded_image
from worker.imaging import decode_image


def test_image_part_only_on_the_image_turn_and_no_invented_system_message() -> None:
    turns = [
        ChatTurn(role="user", text="What is it?", image=True),
        ChatTurn(role="assistant", text="A cat."),
        ChatTurn(role="user", text="What colour?"),
    ]
    assert chat_messages(turns) == [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]},
        {"role": "user", "content": [{"type": "text", "text": "What colour?"}]},
    ]


def test_images_sit_where_the_client_put_them_among_the_text() -> None:
    interleaved = ChatTurn(
        role="user",
        text="Compare this:\nwith this:\nWhich is red?",
        image=True,
        images=["a", "b"],
        image_at=[13, 24],
    )
    assert chat_messages([interleaved])[0]["content"] == [
        {"type": "text", "text": "Compare this:"},
        {"type": "image"},
        {"type": "text", "text": "\nwith this:"},
        {"type": "image"},
        {"type": "text", "text": "\nWhich is red?"},
    ]
    first = ChatTurn(role="user", text="Both?", image=True, images=["a", "b"], image_at=[0, 0])
    unplaced = ChatTurn(role="user", text="Both?", image=True, images=["a", "b"])  # a previous release's turn
    expected = [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Both?"}]
    assert chat_messages([first])[0]["content"] == chat_messages([unplaced])[0]["content"] == expected


def test_sampling_and_request_fields_carry_over() -> None:
    spec = make_spec("hi", digest="d" * 64, deadline=123.0, conversation_id="s1", use_cache=False)
    spec.sampling = SamplingSpec(max_tokens=7, temperature=0.5, top_p=0.9, top_k=5, seed=3, stop=["\n"])
    tensors = {
        "pixel_values": torch.ones(4, 8, dtype=torch.float16),
        "image_grid_thw": torch.tensor([[1, 2, 2]]),
    }
    request = build_request(spec, "job:1", image_input(tensors, "d" * 64))
    assert request.request_id == "job:1" and request.deadline == 123.0 and request.session_id == "s1"
    assert request.use_cache is False and request.sampling == sampling_params(spec.sampling)
    assert request.sampling.stop == ("\n",) and request.sampling.seed == 3
    pixels = request.images[0].pixel_values
    assert pixels is not None and pixels.dtype == torch.float32 and request.images[0].digest == "d" * 64


def test_pixels_are_finished_by_the_processor_exactly() -> None:
    """The decode worker's uint8 picture, finished here, is the processor's own output, bit for bit."""
    handle = ImageProcessorHandle.load(models.test_model_path())
    assert handle.split
    data = image_bytes("JPEG", (333, 222), seed=4)
    image = decoded_image(handle, data, "d" * 64)
    whole = handle(decode_image(data, 10**8, handle.target_pixels))
    assert image.pixel_values is not None and torch.equal(image.pixel_values, whole["pixel_values"])
    assert torch.equal(image.image_grid_thw, whole["image_grid_thw"])


def test_pixels_of_another_processor_or_a_bad_shape_are_refused() -> None:
    handle = ImageProcessorHandle.load(models.test_model_path())
    pixels = torch.zeros(3, 168, 168, dtype=torch.uint8)
    with pytest.raises(TensorCodecError, match="made by image processor"):
        pixels_input(handle, pack_image("not-this-one", {"pixels": pixels}), "d" * 64)
    with pytest.raises(TensorCodecError, match="uint8"):
        pixels_input(handle, pack_image(handle.processor_id, {"pixels": pixels.float()}), "d" * 64)
