"""JobSpec (queue message) -> GenerationRequest (engine input). Pure functions."""

from __future__ import annotations

from typing import Any

import torch

from services.engine.api import GenerationRequest, ImageInput, SamplingParams
from services.vlm.image_processor import ImageProcessorHandle
from shared.schemas import ChatTurn, JobSpec, SamplingSpec
from shared.tensors import TensorCodecError, unpack_image


def chat_messages(turns: list[ChatTurn]) -> list[dict[str, Any]]:
    """Hugging Face chat format; the image part only on the turn that carries the image.

    No system message is invented: the chat template inserts the default system prompt.
    """
    messages = []
    for turn in turns:
        content: list[dict[str, Any]] = [{"type": "image"}] if turn.image else []
        content.append({"type": "text", "text": turn.text})
        messages.append({"role": turn.role, "content": content})
    return messages


def sampling_params(spec: SamplingSpec) -> SamplingParams:
    return SamplingParams(
        max_tokens=spec.max_tokens,
        temperature=spec.temperature,
        top_p=spec.top_p,
        top_k=spec.top_k,
        seed=spec.seed,
        stop=tuple(spec.stop),
        min_tokens=spec.min_tokens,
        ignore_eos=spec.ignore_eos,
    )


def image_input(tensors: dict[str, torch.Tensor], digest: str) -> ImageInput:
    """The image processor's output -> ImageInput, floating tensors in float32 (copied only when
    they are not float32 already: the previous release's float16 wire)."""
    tensors = {k: _float32(v) for k, v in tensors.items()}
    pixel_values = tensors.pop("pixel_values")
    grid = tensors.pop("image_grid_thw")
    return ImageInput(pixel_values=pixel_values, image_grid_thw=grid, digest=digest, extra=tensors)


def _float32(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.float() if tensor.is_floating_point() and tensor.dtype != torch.float32 else tensor


def pixels_input(handle: ImageProcessorHandle, payload: bytes, digest: str) -> ImageInput:
    """A job's pixels as the decode worker stored them (``shared.tensors.pack_image``) -> ImageInput:
    the processor's steps after its resize run here (``ImageProcessorHandle.from_wire``).
    Raises TensorCodecError for a payload it cannot read or one made by another processor config."""
    made_by, tensors = unpack_image(payload)
    if made_by != handle.processor_id:
        mine = handle.processor_id
        raise TensorCodecError(f"pixels made by image processor {made_by}, this worker's is {mine}")
    try:
        return image_input(handle.from_wire(tensors), digest)
    except (ValueError, KeyError) as exc:
        raise TensorCodecError(f"decoded image unreadable: {exc}") from exc


def needs_image(spec: JobSpec) -> bool:
    return any(turn.image for turn in spec.messages)


def build_request(spec: JobSpec, request_id: str, image: ImageInput | None) -> GenerationRequest:
    return GenerationRequest(
        request_id=request_id,
        messages=chat_messages(spec.messages),
        images=[image] if image is not None else [],
        sampling=sampling_params(spec.sampling),
        session_id=spec.affinity_key,
        deadline=spec.deadline,
        use_cache=spec.use_cache,
        priority=1 if spec.priority == "batch" else 0,
    )
