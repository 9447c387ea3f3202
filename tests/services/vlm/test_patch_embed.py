"""The loader runs the vision patch embedding as a matmul: the conv's own result to float rounding."""

from __future__ import annotations

import torch

from bench.common import bundled_model_path, draw_image, image_input
from services.vlm.loading import load_model
from services.vlm.patch_embed import linear_patch_embed


def test_loaded_model_embeds_patches_as_the_conv_does() -> None:
    model, proc = load_model(bundled_model_path())
    embed = model.model.visual.patch_embed
    pixels = image_input(proc, draw_image(3)).pixel_values
    assert pixels is not None
    with torch.no_grad():
        as_matmul = embed(pixels)
        as_conv = embed.proj(pixels.view(-1, 3, 2, 28, 28)).view(-1, embed.embed_dim)
    assert "forward" in vars(embed)  # the loader swapped it in
    assert torch.allclose(as_matmul, as_conv, atol=1e-4) and as_matmul.shape == as_conv.shape


def test_models_without_a_patchify_conv_are_left_alone() -> None:
    assert not linear_patch_embed(torch.nn.Linear(2, 2))
    padded = torch.nn.Module()
    padded.model = torch.nn.Module()
    padded.model.visual = torch.nn.Module()
    padded.model.visual.patch_embed = torch.nn.Module()
    padded.model.visual.patch_embed.proj = torch.nn.Conv3d(3, 4, kernel_size=2, stride=1)  # overlapping
    assert not linear_patch_embed(padded) and "forward" not in vars(padded.model.visual.patch_embed)
