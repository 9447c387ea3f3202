"""Public types of the in-process engine API.

The engine knows nothing of HTTP, Redis or Celery: callers hand it plain objects
(``GenerationRequest``) and read plain objects back (``TokenEvent``). The inference worker
(``services.inference_worker``), tests and benchmarks all drive it through these types.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch


class FinishReason(enum.StrEnum):
    STOP = "stop"  # EOS or a stop string
    LENGTH = "length"  # max_tokens reached
    CANCELLED = "cancelled"
    EXPIRED = "expired"  # deadline passed before or during the run
    ERROR = "error"
    REJECTED = "rejected"  # the prompt was refused before it ran (``error`` says why): the caller's fault


class RequestRejected(ValueError):
    """A request the engine refuses before it touches the batch (bad params, too long, bad tensor)."""


@dataclass(frozen=True)
class StructuredOutput:
    """Constrain the output to JSON: any object (``json_object``) or one JSON Schema (``json_schema``,
    ``schema`` its JSON text). Decoded under a grammar (``services.engine.grammar``)."""

    kind: str  # "json_object" | "json_schema"
    schema: str | None = None


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False  # keep generating past EOS (benchmarks; like vLLM's ignore_eos)
    min_tokens: int = 0  # like vLLM's: no EOS and no stop string before this many tokens
    structured: StructuredOutput | None = None  # None: free text


class DeferredPixels(Protocol):
    """Pixel values made when the engine encodes the image, where they were not made before: a
    picture shipped as uint8 and finished on the engine's device (``services.vlm.pixel_table``), or
    by the image processor on the first thread that asks (the inference worker's
    ``ProcessorPixels``). ``shape`` is known first; ``make`` returns float32 values, all finite (the
    processor's table, checked finite where it is built, shows its values are), or raises."""

    @property
    def shape(self) -> tuple[int, int]: ...

    def make(self, device: torch.device) -> torch.Tensor: ...


@dataclass(frozen=True)
class ImageInput:
    """One preprocessed image: the model image processor's output plus the digest of the source bytes.
    ``pixel_values`` is None where ``deferred`` makes them when the image is encoded (grid models only)."""

    pixel_values: torch.Tensor | None
    image_grid_thw: torch.Tensor  # (1, 3) for Qwen2-VL/GLM-4V style processors
    digest: str  # full sha256 hex of the original image bytes (image-embedding cache key)
    extra: dict[str, torch.Tensor] = field(default_factory=dict)  # other processor outputs, if any
    deferred: DeferredPixels | None = None


@dataclass
class GenerationRequest:
    """One generation. ``messages`` is the whole conversation in Hugging Face chat format
    (``{"role": ..., "content": [{"type": "image"}, {"type": "text", "text": ...}]}``);
    ``images`` are the tensors for the image parts, in order."""

    request_id: str
    messages: list[dict[str, Any]]
    images: list[ImageInput] = field(default_factory=list)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    session_id: str | None = None
    deadline: float | None = None  # time.time() epoch seconds; None = no deadline
    use_cache: bool = True  # False: bypass prefix/session/image caches (exactness tests, debugging)
    priority: int = 0  # 0 first; higher waits (batch work), until it has waited ``priority_aging_s``


@dataclass(frozen=True)
class Timings:
    """Seconds spent per stage for one request (the seeds' latency table, measured)."""

    queue: float = 0.0  # engine admission wait
    vision: float = 0.0
    prefill: float = 0.0
    generation: float = 0.0
    ttft: float = 0.0  # submit -> first token


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix or session cache


@dataclass(frozen=True)
class TokenEvent:
    """One step of output for one request. The last event has ``finish_reason`` set."""

    request_id: str
    token_ids: tuple[int, ...]
    text: str  # decoded text delta (may be empty while a multi-byte character is incomplete)
    index: int  # number of completion tokens produced before this event
    finish_reason: FinishReason | None = None
    error: str | None = None
    usage: Usage | None = None  # set on the last event
    timings: Timings | None = None  # set on the last event

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
