"""The msgpack tensor codec: exact round trips of the wire dtypes, and bounded, clear refusals."""

from __future__ import annotations

import msgpack
import pytest
import torch

from shared.tensors import (
    MAX_ELEMENTS,
    TensorCodecError,
    pack_image,
    pack_tensors,
    unpack_image,
    unpack_tensors,
)


def test_round_trip_keeps_shapes_and_integer_values_exactly() -> None:
    tensors = {
        "pixel_values": torch.linspace(-2, 2, 24).reshape(4, 6),
        "image_grid_thw": torch.tensor([[1, 6, 6]]),
        "mask": torch.tensor([1, 0, 1], dtype=torch.uint8),
    }
    out = unpack_tensors(pack_tensors(tensors))
    assert out["pixel_values"].dtype == torch.float16  # floats travel as float16
    assert torch.equal(out["pixel_values"].float(), tensors["pixel_values"].half().float())
    assert torch.equal(out["image_grid_thw"], tensors["image_grid_thw"])
    assert torch.equal(out["mask"], tensors["mask"])


def test_bfloat16_travels_as_its_bit_pattern() -> None:
    value = torch.tensor([1.5, -3.25, 1e-3]).bfloat16()
    out = unpack_tensors(pack_tensors({"x": value}, wire_dtype="bfloat16"))["x"]
    assert out.dtype == torch.bfloat16 and torch.equal(out, value)


def _entry(dtype: str, shape: list[int], data: bytes) -> bytes:
    return msgpack.packb({"x": {"dtype": dtype, "shape": shape, "data": data}}, use_bin_type=True)


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        (b"\xc1not msgpack", "malformed"),
        (msgpack.packb([1, 2, 3]), "not a map"),
        (msgpack.packb({"x": {"dtype": "float32"}}), "lacks"),
        (_entry("object", [1], b"x"), "unsupported tensor dtype"),
        (_entry("float32", [-1], b""), "bad tensor shape"),
        (_entry("uint8", [MAX_ELEMENTS + 1], b""), "exceeds"),
        (_entry("float32", [2], b"\0" * 7), "does not match"),
    ],
)
def test_bad_payloads_raise_a_codec_error(payload: bytes, words: str) -> None:
    with pytest.raises(TensorCodecError, match=words):
        unpack_tensors(payload)


def test_an_image_travels_with_the_id_of_its_processor() -> None:
    pixels = torch.randint(0, 256, (3, 8, 6), dtype=torch.uint8)
    made_by, out = unpack_image(pack_image("proc-1", {"pixels": pixels}))
    assert made_by == "proc-1" and torch.equal(out["pixels"], pixels)


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        (b"\xc1not msgpack", "malformed"),
        (msgpack.packb({"tensors": {}}), "processor id"),
        (msgpack.packb({"processor": "p", "tensors": [1]}), "lacks its tensors"),
        (msgpack.packb({"processor": "p", "tensors": {"x": {"dtype": "object"}}}), "lacks"),
    ],
)
def test_bad_image_payloads_raise_a_codec_error(payload: bytes, words: str) -> None:
    with pytest.raises(TensorCodecError, match=words):
        unpack_image(payload)
