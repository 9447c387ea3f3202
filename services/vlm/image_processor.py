"""The checkpoint's image processor as both workers use it: loaded once, named by its config.

The decode worker runs it on decoded pictures; the inference worker only needs its id, which
names the pixel tensors the decode workers wrote (``Keys.tensor``): tensors made by another
processor config are never reused.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from services.vlm.loading import load_image_processor


@dataclass
class ImageProcessorHandle:
    """The checkpoint's image processor, its id (hash of its config) and its pixel budget."""

    processor: Any
    processor_id: str
    target_pixels: int | None

    @classmethod
    def load(cls, model_path: str | Path) -> ImageProcessorHandle:
        return cls.wrap(load_image_processor(model_path))

    @classmethod
    def wrap(cls, processor: Any) -> ImageProcessorHandle:
        return cls(processor, processor_id(processor), target_pixels(processor))

    def __call__(self, img: Image.Image) -> dict[str, Any]:
        out = self.processor(images=[img], return_tensors="pt")
        return {k: v for k, v in out.items() if hasattr(v, "dtype")}


def processor_id(processor: Any) -> str:
    """Short hash of the processor config: tensors made by another config never get reused."""
    config = json.loads(processor.to_json_string())
    config.pop("processor_class", None)
    blob = json.dumps(config, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def target_pixels(processor: Any) -> int | None:
    """Largest image the processor keeps (Qwen2-VL/GLM-4V: ``size.longest_edge`` is max pixels)."""
    size = getattr(processor, "size", None) or {}
    value = size.get("longest_edge") or size.get("max_pixels") or getattr(processor, "max_pixels", None)
    return int(value) if value else None
