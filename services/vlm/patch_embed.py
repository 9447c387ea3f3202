"""The vision patch embedding as the matmul it is.

GLM-4V's (and Qwen2-VL's) patch embedding is a ``Conv3d`` whose kernel equals its stride over
pre-cut patches: one matrix product of (patches, C*T*P*P) by (C*T*P*P, width). PyTorch's CPU
Conv3d takes a slow path for it (measured ~3x the matmul on the bundled model's 36-patch
pictures, ~40 % of the vision tower's time), so the loader swaps in the product: the same
weights; the float sums in another order (differences ~1e-5), which is the path vlmq-tiny was
trained with (``tinyvlm.train``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def linear_patch_embed(model: Any) -> bool:
    """Run ``model``'s vision patch embedding as one ``F.linear`` (in place). False, and nothing
    changed, where the model has no such Conv3d (another architecture, or a padded/overlapping one)."""
    embed: Any = getattr(getattr(getattr(model, "model", None), "visual", None), "patch_embed", None)
    conv = getattr(embed, "proj", None)
    if not isinstance(conv, torch.nn.Conv3d) or not _is_patchify(conv):
        return False

    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        flat = hidden_states.reshape(-1, conv.weight[0].numel()).to(conv.weight.dtype)
        return F.linear(flat, conv.weight.reshape(conv.out_channels, -1), conv.bias)

    embed.forward = forward
    return True


def _is_patchify(conv: torch.nn.Conv3d) -> bool:
    return conv.kernel_size == conv.stride and conv.padding == (0, 0, 0) and conv.groups == 1
