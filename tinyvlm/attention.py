"""Training attention: eager only where the pointer loss reads the weights, SDPA elsewhere.

The pointer loss (``tinyvlm.pointers``) reads the attention weights of two text layers, and only
HF's eager attention returns them. Eager in every layer cost ~30-40 % of a joint step (the score
matmuls, their scaling, softmax and its backward over (rows, heads, queries, keys)); SDPA's fused
kernel does the other layers' attention without materialising the weights. Both take the same
additive mask (eager's), so padding is handled alike. The saved model is a plain Glm4v: the
attention implementation is not written to its config, so this is a training-time setting only.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import eager_mask
from transformers.models.glm4v.modeling_glm4v import eager_attention_forward

from tinyvlm import pointers

NAME = "tinyvlm_pointer_layers"
EAGER_LAYERS = frozenset({pointers.MENTION_LAYER, pointers.ANSWER_LAYER})


def pointer_layers_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Eager attention (weights returned) in the pointer layers, SDPA (no weights) in the others."""
    if getattr(module, "layer_idx", None) in EAGER_LAYERS:
        return eager_attention_forward(module, query, key, value, attention_mask, **kwargs)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


AttentionInterface.register(NAME, pointer_layers_attention)
AttentionMaskInterface.register(NAME, eager_mask)  # one additive float mask serves both kernels
