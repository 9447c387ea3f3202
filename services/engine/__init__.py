"""In-process inference engine: continuous micro-batching over any HF VLM, with prefix, session and
image-embedding caches. See ``engine.Engine`` (entry point) and ``api`` (public types)."""

from services.engine.api import (
    FinishReason,
    GenerationRequest,
    ImageInput,
    RequestRejected,
    SamplingParams,
    Timings,
    TokenEvent,
    Usage,
)
from services.engine.config import EngineConfig
from services.engine.engine import Engine
from services.engine.stats import EngineStats

__all__ = [
    "Engine",
    "EngineConfig",
    "EngineStats",
    "FinishReason",
    "GenerationRequest",
    "ImageInput",
    "RequestRejected",
    "SamplingParams",
    "Timings",
    "TokenEvent",
    "Usage",
]
