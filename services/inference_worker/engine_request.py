"""JobSpec (queue message) -> GenerationRequest (engine input). Pure functions."""

from __future__ import annotations

from typing import Any

import torch

from services.engine.api import GenerationRequest, ImageInput, SamplingParams, StructuredOutput
from shared.schemas import ChatTurn, JobSpec, ResponseFormat, SamplingSpec


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
        structured=structured_output(spec.response_format),
    )


def structured_output(response_format: ResponseFormat | None) -> StructuredOutput | None:
    if response_format is None:
        return None
    return StructuredOutput(response_format.type, response_format.json_schema)


def image_input(tensors: dict[str, torch.Tensor], digest: str) -> ImageInput:
    """Processor output from Redis (float16 on the wire) -> ImageInput in float32."""
    tensors = {k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}
    pixel_values = tensors.pop("pixel_values")
    grid = tensors.pop("image_grid_thw")
    return ImageInput(pixel_values=pixel_values, image_grid_thw=grid, digest=digest, extra=tensors)


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
