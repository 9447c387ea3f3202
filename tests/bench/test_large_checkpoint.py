"""``bench.large_checkpoint`` writes a folder the service's own loader serves, with the weights it built."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from PIL import Image
from transformers import AutoProcessor

from bench.common import build_large_glm, bundled_model_path, draw_image
from bench.large_checkpoint import main
from services.vlm.image_processor import ImageProcessorHandle
from services.vlm.loading import load_model
from services.vlm.patch_embed import linear_patch_embed

pytestmark = pytest.mark.slow


def _greedy(model: torch.nn.Module, processor: object, text: str, image: Image.Image) -> list[int]:
    inputs = processor(text=[text], images=[image], return_tensors="pt")  # type: ignore[operator]
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=6, do_sample=False)  # type: ignore[operator]
    return [int(t) for t in out[0, inputs["input_ids"].shape[1] :]]


def test_written_checkpoint_loads_and_answers_as_built(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "large"
    assert main([str(out), "--small"]) == 0
    assert "M parameters" in capsys.readouterr().out

    served, processor = load_model(out)  # as the inference worker loads a checkpoint
    assert ImageProcessorHandle.load(out).split  # as the decode workers load its processor
    built = build_large_glm(AutoProcessor.from_pretrained(bundled_model_path()), small=True)
    linear_patch_embed(built)  # as load_model does to what it loads
    assert served.config.text_config.hidden_size == built.config.text_config.hidden_size == 256

    turn = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}]
    text = processor.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)
    image = Image.open(io.BytesIO(draw_image(7, (96, 96)))).convert("RGB")
    assert _greedy(served, processor, text, image) == _greedy(built.eval(), processor, text, image)
