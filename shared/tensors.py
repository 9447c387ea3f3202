"""msgpack codec for named tensors: compact dtype on the wire, hard limits on unpack.

Pickle is never used between processes; a malformed or oversized payload raises
``TensorCodecError`` instead of allocating without bound. ``pack_image`` adds the id of the
image processor that made the tensors (a job's pixels, ``Keys.job_pixels``).
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import torch

MAX_PAYLOAD_BYTES = 64 * 1024 * 1024
MAX_TENSORS = 16
MAX_ELEMENTS = 16 * 1024 * 1024
MAX_IMAGES = 16  # in one job's payload (the gateway's VLMQ_MAX_IMAGES_PER_REQUEST is lower)
MAX_DIMS = 8
_WIRE_DTYPES = {"float32", "float16", "bfloat16", "int64", "int32", "uint8"}


class TensorCodecError(ValueError):
    pass


def pack_tensors(tensors: dict[str, torch.Tensor], wire_dtype: str = "float16") -> bytes:
    """Floating tensors travel as ``wire_dtype`` (float16 halves the bytes of pixel values)."""
    entries = {name: _pack_one(t, wire_dtype) for name, t in tensors.items()}
    return msgpack.packb(entries, use_bin_type=True)


def unpack_tensors(payload: bytes) -> dict[str, torch.Tensor]:
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise TensorCodecError(f"tensor payload of {len(payload)} bytes exceeds {MAX_PAYLOAD_BYTES}")
    try:
        raw = msgpack.unpackb(payload, raw=False, max_bin_len=MAX_PAYLOAD_BYTES, max_map_len=MAX_TENSORS)
    except Exception as exc:  # msgpack raises several unrelated types
        raise TensorCodecError(f"malformed tensor payload: {exc}") from exc
    if not isinstance(raw, dict):
        raise TensorCodecError("tensor payload is not a map")
    return {str(name): _unpack_one(entry) for name, entry in raw.items()}


def pack_image(processor_id: str, tensors: dict[str, torch.Tensor]) -> bytes:
    """One image's tensors for the wire, named by the processor config that made them."""
    entries = {name: _pack_one(t, "float16") for name, t in tensors.items()}
    return msgpack.packb({"processor": processor_id, "tensors": entries}, use_bin_type=True)


def unpack_image(payload: bytes) -> tuple[str, dict[str, torch.Tensor]]:
    """(processor id, tensors) of ``pack_image``'s payload; TensorCodecError when malformed."""
    made_by, images = unpack_images(payload)
    if len(images) != 1:
        raise TensorCodecError(f"image payload holds {len(images)} images, not one")
    return made_by, images[0]


def pack_images(processor_id: str, images: list[dict[str, torch.Tensor]]) -> bytes:
    """A job's images (each once, in order of first appearance) for the wire; one image is written
    as ``pack_image`` writes it (what the previous release reads)."""
    if len(images) == 1:
        return pack_image(processor_id, images[0])
    entries = [{name: _pack_one(t, "float16") for name, t in tensors.items()} for tensors in images]
    return msgpack.packb({"processor": processor_id, "images": entries}, use_bin_type=True)


def unpack_images(payload: bytes) -> tuple[str, list[dict[str, torch.Tensor]]]:
    """(processor id, each image's tensors) of ``pack_images`` or ``pack_image``."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise TensorCodecError(f"image payload of {len(payload)} bytes exceeds {MAX_PAYLOAD_BYTES}")
    try:
        raw = msgpack.unpackb(
            payload,
            raw=False,
            max_bin_len=MAX_PAYLOAD_BYTES,
            max_map_len=MAX_TENSORS,
            max_array_len=max(MAX_IMAGES, MAX_DIMS),
        )
    except Exception as exc:  # msgpack raises several unrelated types
        raise TensorCodecError(f"malformed image payload: {exc}") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("processor"), str):
        raise TensorCodecError("image payload lacks its processor id")
    entries = raw.get("images", [raw.get("tensors")])
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise TensorCodecError("image payload lacks its tensors")
    return raw["processor"], [{str(n): _unpack_one(e) for n, e in entry.items()} for entry in entries]


def _pack_one(tensor: torch.Tensor, wire_dtype: str) -> dict[str, Any]:
    tensor = tensor.detach().cpu()
    if tensor.is_floating_point():
        tensor = tensor.to(getattr(torch, wire_dtype))
    dtype = str(tensor.dtype).removeprefix("torch.")
    if dtype == "bfloat16":  # numpy has no bfloat16: ship the raw 16-bit pattern
        data = tensor.contiguous().view(torch.int16).numpy().tobytes()
    else:
        data = tensor.contiguous().numpy().tobytes()
    return {"dtype": dtype, "shape": list(tensor.shape), "data": data}


def _unpack_one(entry: Any) -> torch.Tensor:
    if not isinstance(entry, dict) or {"dtype", "shape", "data"} - entry.keys():
        raise TensorCodecError("tensor entry lacks dtype/shape/data")
    dtype, shape, data = entry["dtype"], entry["shape"], entry["data"]
    if dtype not in _WIRE_DTYPES:
        raise TensorCodecError(f"unsupported tensor dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise TensorCodecError(f"bad tensor shape {shape!r}")
    count = int(np.prod(shape)) if shape else 1
    if count > MAX_ELEMENTS:
        raise TensorCodecError(f"tensor of {count} elements exceeds {MAX_ELEMENTS}")
    np_dtype = np.int16 if dtype == "bfloat16" else np.dtype(dtype)
    if not isinstance(data, bytes) or len(data) != count * np.dtype(np_dtype).itemsize:
        raise TensorCodecError("tensor data length does not match its shape")
    tensor = torch.from_numpy(np.frombuffer(data, dtype=np_dtype).copy()).reshape(shape)
    return tensor.view(torch.bfloat16) if dtype == "bfloat16" else tensor
