"""Load a VLM checkpoint (vlmq-tiny or any AutoModelForImageTextToText model) from a local path."""

import os
from pathlib import Path
from typing import Any

import torch
from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoProcessor, PreTrainedModel

from services.vlm import registration as _registration  # noqa: F401  (processor lookup by name)
from services.vlm.patch_embed import linear_patch_embed
from services.vlm.quantization import QuantizeMode, quantize_model

# Never reach for the Hub: every checkpoint this service loads is a local directory.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def load_model(
    path: str | Path, quantize: QuantizeMode | str = "none", device: str = "cpu"
) -> tuple[PreTrainedModel, Any]:
    """Model (eval mode, quantized as asked, on ``device``) and its processor."""
    model: Any = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32)
    model.eval()
    quantize_model(model, quantize, device=device)  # in place
    linear_patch_embed(model)  # the matmul it is (services/vlm/patch_embed.py)
    processor = AutoProcessor.from_pretrained(path)
    return model, processor


def load_image_processor(path: str | Path) -> Any:
    """The image processor alone: what CPU decode workers need (no model weights)."""
    return AutoImageProcessor.from_pretrained(path)
