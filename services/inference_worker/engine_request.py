"""JobSpec (queue message) -> GenerationRequest (engine input), and the pictures' last steps."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from services.engine.api import GenerationRequest, ImageInput, SamplingParams, StructuredOutput
from services.inference_worker.image_inputs import Wire
from services.vlm.image_processor import RESIZED, ImageProcessorHandle
from services.vlm.pixel_table import PixelTable
from shared.schemas import ChatTurn, JobSpec, ResponseFormat, SamplingSpec
from shared.tensors import TensorCodecError, unpack_images


def chat_messages(turns: list[ChatTurn]) -> list[dict[str, Any]]:
    """Hugging Face chat format: each turn's image parts (one per image it shows) where the client
    put them among its text (``ChatTurn.image_at``), else before it.

    No system message is invented: the chat template inserts the default system prompt.
    """
    return [{"role": turn.role, "content": content_parts(turn)} for turn in turns]


def content_parts(turn: ChatTurn) -> list[dict[str, Any]]:
    shown = len(turn.images) or int(turn.image)  # a previous-release turn: its job's one image
    offsets = turn.image_at if len(turn.image_at) == shown else [0] * shown
    content: list[dict[str, Any]] = []
    start = 0
    for at in offsets:
        if at > start:
            content.append({"type": "text", "text": turn.text[start:at]})
            start = at
        content.append({"type": "image"})
    content.append({"type": "text", "text": turn.text[start:]})
    return content


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
        structured=structured_output(spec.response_format),
    )


def structured_output(response_format: ResponseFormat | None) -> StructuredOutput | None:
    if response_format is None:
        return None
    return StructuredOutput(response_format.type, response_format.json_schema)


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
    """One image's pixels (``shared.tensors.pack_image``) -> ImageInput."""
    return wire_inputs(handle, unpack_wires(handle, payload, [digest]))[digest]


def unpack_wires(handle: ImageProcessorHandle, payload: bytes, digests: list[str]) -> dict[str, Wire]:
    """A job's pixels as the decode worker stored them (``shared.tensors.pack_images``: its images
    in ``spec.image_digests()`` order) -> each image's wire tensors by digest. Raises
    TensorCodecError for a payload it cannot read, one made by another processor config, or one
    with another number of images."""
    made_by, images = unpack_images(payload)
    if made_by != handle.processor_id:
        mine = handle.processor_id
        raise TensorCodecError(f"pixels made by image processor {made_by}, this worker's is {mine}")
    if len(images) != len(digests):
        raise TensorCodecError(f"pixels of {len(images)} images for a job that shows {len(digests)}")
    return dict(zip(digests, images, strict=True))


def wire_inputs(handle: ImageProcessorHandle, wires: dict[str, Wire]) -> dict[str, ImageInput]:
    """Wire tensors by digest -> ImageInput by digest (``wire_input``). TensorCodecError when one is
    unreadable (a deferred picture's values: when they are made, ``ProcessorPixels.prepare``)."""
    try:
        return {d: wire_input(handle, t, d) for d, t in wires.items()}
    except (ValueError, KeyError) as exc:
        raise TensorCodecError(f"decoded image unreadable: {exc}") from exc


def wire_input(handle: ImageProcessorHandle, wire: Wire, digest: str) -> ImageInput:
    """The processor's steps after its resize, deferred where its ``table`` gives the picture's
    shape: made on the engine's device (``TablePixels``), or by the processor once, on the first
    thread that asks (``ProcessorPixels``). Else they run here (``ImageProcessorHandle.from_wire``)."""
    table, picture = handle.table, wire.get(RESIZED)
    if table is None or picture is None or not table.takes(picture):
        return image_input(handle.from_wire(wire), digest)
    grid = table.grid(tuple(picture.shape))
    if handle.finish_on_device:
        return ImageInput(None, grid, digest, deferred=TablePixels(table, picture))
    shape = table.patches_shape(tuple(picture.shape))
    return ImageInput(None, grid, digest, deferred=ProcessorPixels(handle, picture, shape))


@dataclass(frozen=True)
class TablePixels:
    """A uint8 picture the engine finishes on its own device (the engine's ``DeferredPixels``)."""

    table: PixelTable
    picture: torch.Tensor  # uint8 (channels, height, width), as the decode worker shipped it

    @property
    def shape(self) -> tuple[int, int]:
        return self.table.patches_shape(tuple(self.picture.shape))

    def make(self, device: torch.device) -> torch.Tensor:
        return self.table.finish(self.picture, device)


class ProcessorPixels:
    """A uint8 picture the processor finishes (its numpy steps) once, on whichever thread asks
    first: the worker's main thread (``prepare``: right after it handed the job to an idle engine,
    while the engine's thread renders the prompt; before the hand-over to a busy one), or the
    engine's, encoding the image (``make``). The engine takes the shape (from the processor's table)
    before the values."""

    def __init__(self, handle: ImageProcessorHandle, picture: torch.Tensor, shape: tuple[int, int]) -> None:
        self.handle, self.picture, self.shape = handle, picture, shape
        self._lock = threading.Lock()
        self._values: torch.Tensor | None = None
        self._failure: Exception | None = None  # raised again, never retried: the work is done once

    def prepare(self) -> torch.Tensor:
        """The values (TensorCodecError where the processor cannot finish the picture)."""
        with self._lock:
            if self._values is None and self._failure is None:
                try:
                    self._values = _float32(self.handle.finish(self.picture.numpy())["pixel_values"])
                except Exception as exc:
                    self._failure = TensorCodecError(f"decoded image unreadable: {exc}")
            if self._failure is not None:
                raise self._failure
            assert self._values is not None
            return self._values

    def make(self, device: torch.device) -> torch.Tensor:
        return self.prepare().to(device)


def prepare_pictures(requests: Iterable[GenerationRequest]) -> list[TensorCodecError | None]:
    """Finish the requests' ``ProcessorPixels`` on this thread; per request, why one of its
    pictures cannot be finished (else None). A request already submitted with such a picture fails
    in the engine, whose ``make`` raises the same error: only that request."""
    return [_prepared(request) for request in requests]


def _prepared(request: GenerationRequest) -> TensorCodecError | None:
    for image in request.images:
        if isinstance(image.deferred, ProcessorPixels):
            try:
                image.deferred.prepare()
            except TensorCodecError as exc:
                return exc
    return None


def needs_image(spec: JobSpec) -> bool:
    return any(turn.image or turn.images for turn in spec.messages)


def build_request(
    spec: JobSpec, request_id: str, images: dict[str, ImageInput] | ImageInput | None
) -> GenerationRequest:
    """The job as the engine takes it; ``images`` by digest (one input per image part, in order: an
    image shown twice is the same input, its features computed once), or the one image of a job."""
    legacy = spec.image_digest
    if isinstance(images, ImageInput):
        legacy = legacy or images.digest
        images = {legacy: images}
    parts = [d for turn in spec.messages for d in turn.digests(legacy)]
    missing = [d for d in parts if d not in (images or {})]
    if missing:
        raise LookupError(f"no decoded image for {len(missing)} image part(s) of the conversation")
    return GenerationRequest(
        request_id=request_id,
        messages=chat_messages(spec.messages),
        images=[(images or {})[d] for d in parts],
        sampling=sampling_params(spec.sampling),
        session_id=spec.affinity_key,
        deadline=spec.deadline,
        use_cache=spec.use_cache,
        priority=1 if spec.priority == "batch" else 0,
    )
