"""The lean GLM-4V vision forward: features bit-identical to ``get_image_features`` for one and
several images and grids, its per-grid tensors renewed when the position table changes, and the
model's own forward wherever the lean one would not be the same."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from bench.common import load_bundled
from services.engine.architectures import Architecture
from services.engine.lean_glm4v_vision import LeanGlm4vVision
from services.vlm.image_processor import ImageProcessorHandle


def patches(
    model: Any, grids: list[tuple[int, int, int]], seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random pixel patches for ``grids`` ((t, h, w) in patches), as the processor lays them out."""
    vc = model.config.vision_config
    width = vc.in_channels * vc.temporal_patch_size * vc.patch_size**2
    count = sum(t * h * w for t, h, w in grids)
    g = torch.Generator().manual_seed(seed)
    return torch.randn(count, width, generator=g), torch.tensor(grids)


def hf_features(model: Any, pixels: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        out = model.model.get_image_features(pixel_values=pixels, image_grid_thw=grid)
    return torch.cat(list(out.pooler_output))


def lean_features(lean: LeanGlm4vVision, pixels: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return lean.features(pixels, grid)


@pytest.mark.parametrize("which", ["bundled", "bundled-bf16", "glm4v"])
def test_features_are_bit_identical(
    which: str, bundled: tuple[Any, Any], tiny_models: dict[str, Any]
) -> None:
    """bf16-mixed mode casts the whole tower (no hooks there): the lean forward runs it too."""
    models = {"bundled": bundled, "glm4v": tiny_models["glm4v"]}
    model, _processor = models[which] if which in models else load_bundled("bf16")
    lean = LeanGlm4vVision(model)
    assert LeanGlm4vVision.supports(model) and lean.usable()
    layouts = [[(1, 6, 6)], [(1, 6, 6)] * 3, [(1, 4, 6), (1, 6, 6), (1, 2, 8)], [(1, 4, 6)]]
    for seed, grids in enumerate(layouts * 2):  # twice: the second time from the grid cache
        pixels, grid = patches(model, grids, seed)
        assert torch.equal(lean_features(lean, pixels, grid), hf_features(model, pixels, grid)), grids


def test_the_engine_encodes_real_pictures_the_same(bundled: tuple[Any, Any]) -> None:
    model, processor = bundled
    handle = ImageProcessorHandle.wrap(processor.image_processor)
    images = [_image_input(handle, seed) for seed in range(3)]
    lean, plain = Architecture(model, processor, lean=True), Architecture(model, processor)
    assert lean.lean_vision is not None and plain.lean_vision is None
    for a, b in zip(lean.encode_images(images), plain.encode_images(images), strict=True):
        assert torch.equal(a, b)


def test_a_changed_position_table_renews_the_grid_tensors(tiny_models: dict[str, Any]) -> None:
    model = build_fresh_glm4v(tiny_models)
    lean = LeanGlm4vVision(model)
    pixels, grid = patches(model, [(1, 4, 6)])
    lean_features(lean, pixels, grid)
    with torch.no_grad():
        model.model.visual.embeddings.position_embedding.weight.mul_(1.5)
    assert torch.equal(lean_features(lean, pixels, grid), hf_features(model, pixels, grid))


def test_hooks_and_training_keep_the_model_forward(bundled: tuple[Any, Any]) -> None:
    arch = Architecture(*bundled, lean=True)
    assert arch.lean_vision is not None and arch.lean_vision.usable()
    handle = bundled[0].model.visual.blocks[0].register_forward_hook(lambda *_: None)
    try:
        assert not arch.lean_vision.usable()
    finally:
        handle.remove()
    assert arch.lean_vision.usable()
    bundled[0].model.visual.train()
    try:
        assert not arch.lean_vision.usable()  # dropout settings may apply
    finally:
        bundled[0].model.visual.eval()


def test_other_architectures_keep_the_model_forward(tiny_models: dict[str, tuple[Any, Any]]) -> None:
    for name in ("qwen2_vl", "llava"):
        assert Architecture(*tiny_models[name], lean=True).lean_vision is None


def _image_input(handle: ImageProcessorHandle, seed: int) -> Any:
    import numpy as np
    from PIL import Image

    from services.inference_worker.engine_request import image_input

    rng = np.random.default_rng(seed)
    picture = Image.fromarray(rng.integers(0, 256, (90 + 30 * seed, 120, 3), dtype=np.uint8))
    return image_input(handle(picture), f"{seed:064x}")


def build_fresh_glm4v(tiny_models: dict[str, Any]) -> Any:
    """A copy of the tiny GLM-4V (the session's fixture must keep its weights)."""
    import copy

    return copy.deepcopy(tiny_models["glm4v"][0])


def test_the_grid_cache_stays_within_its_bytes(
    tiny_models: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many grids (a dynamic-resolution processor's pictures): the kept tensors never pass the
    budget, one grid too big for it is made anew each call, and the features stay exact."""
    import services.engine.lean_glm4v_vision as lean_vision

    model = tiny_models["glm4v"][0]
    lean = LeanGlm4vVision(model)
    one = lean._make_grid(torch.tensor([[1, 4, 4]]), torch.zeros(16, model.config.vision_config.hidden_size))
    monkeypatch.setattr(lean_vision, "GRID_CACHE_BYTES", 3 * one.nbytes)
    for side in (2, 4, 6, 8, 4, 10, 12):
        pixels, grid = patches(model, [(1, side, 4), (1, 4, side)], side)
        assert torch.equal(lean_features(lean, pixels, grid), hf_features(model, pixels, grid))
        assert 0 < lean._cached_bytes <= lean_vision.GRID_CACHE_BYTES
        assert lean._cached_bytes == sum(g.nbytes for g in lean._grids.values())
    kept = [row for row, *_ in lean._grids]
    assert kept and all(t * h * w <= 12 for t, h, w in kept)  # over a quarter of the budget: not kept
