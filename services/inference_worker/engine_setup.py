"""The engine as the inference worker builds it from its settings."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from services.engine import Engine, EngineConfig
from services.vlm.image_processor import ImageProcessorHandle
from services.vlm.loading import load_image_processor
from services.vlm.pixel_table import PixelTable
from shared.config import InferenceSettings

log = logging.getLogger(__name__)


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def engine_config(settings: InferenceSettings, config_cls: Any = EngineConfig) -> EngineConfig:
    """EngineConfig from settings; a setting EngineConfig lacks is an error, never silently dropped."""
    mb = 1024 * 1024
    values: dict[str, Any] = {
        "model_path": settings.model,
        "quantize": settings.quantize,
        "device": resolve_device(settings.device),
        "max_batch": settings.max_batch,
        "batch_window_ms": settings.batch_window_ms,
        "prefill_min_free": settings.prefill_min_free,
        "mix_padding_tokens": settings.mix_padding_tokens,
        "max_context_tokens": settings.max_context_tokens,
        "max_new_tokens_limit": settings.max_tokens_limit,
        "prefix_cache": settings.prefix_cache,
        "session_cache": settings.session_cache,
        "image_cache": settings.image_cache,
        "prefix_cache_bytes": settings.prefix_cache_mb * mb,
        "session_cache_bytes": settings.session_cache_mb * mb,
        "image_cache_bytes": settings.image_cache_mb * mb,
        "session_ttl_s": settings.session_ttl_s,
        "priority_aging_s": settings.priority_aging_s,
        "max_failed_steps": settings.max_failed_steps,
    }
    unknown = sorted(set(values) - {f.name for f in dataclasses.fields(config_cls)})
    if unknown:
        raise ValueError(f"{config_cls.__name__} has no field(s) {unknown}: settings and engine disagree")
    config: EngineConfig = config_cls(**values)
    return config


def pixel_processor(engine: Engine, model_path: str) -> ImageProcessorHandle:
    """The engine's image processor: its id names the pixels the decode workers wrote, and it runs
    the steps after their resize (``ImageProcessorHandle.from_wire``)."""
    found = getattr(engine, "image_processor", None)
    return ImageProcessorHandle.wrap(found if found is not None else load_image_processor(model_path))


def attach_pixel_table(pixels: ImageProcessorHandle, settings: InferenceSettings) -> None:
    """The processor's steps after the resize as a table, where they are one (``PixelTable.build``):
    the engine then takes a picture's shape before its values. Where ``pixels_on_device`` resolves
    on, the engine makes the values from the table on its device; else the processor's own steps
    make them (``engine_request.ProcessorPixels``: on the CPU numpy's steps are as fast as the
    table's), on the worker's main thread before the hand-over to a busy engine, after it to an idle
    one, while the engine's thread renders the prompt."""
    wanted = settings.pixels_on_device == "true" or (
        settings.pixels_on_device == "auto" and resolve_device(settings.device) != "cpu"
    )
    pixels.table = PixelTable.build(pixels)
    pixels.finish_on_device = wanted and pixels.table is not None
    if wanted:
        where = "on the engine's device" if pixels.table else "by the processor (its steps are not a table)"
        log.info("pictures are finished %s", where)
