"""Quantization modes: what gets replaced, sizes shrink, int8 rows do not depend on the batch."""

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from services.vlm.quantization import Int8Linear, bf16_logit_error, model_size_bytes


def test_int8_linear_is_close_and_batch_independent() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(64, 48)
    q = Int8Linear(linear)
    x = torch.randn(5, 64)
    x[0] *= 50  # one loud row must not change the others' scales
    together = q(x)
    alone = torch.cat([q(x[i : i + 1]) for i in range(5)])
    assert torch.equal(together, alone)
    rel = (together - linear(x)).norm() / linear(x).norm()
    assert rel < 0.02


def test_modes_shrink_language_model(loaded: Callable[[str], tuple[Any, Any]]) -> None:
    sizes = {mode: model_size_bytes(loaded(mode)[0]) for mode in ("none", "bf16", "int8", "int4")}
    assert sizes["bf16"] < 0.55 * sizes["none"]
    assert sizes["int4"] < sizes["int8"] < sizes["none"]
    int8_model = loaded("int8")[0]
    assert any(isinstance(m, Int8Linear) for m in int8_model.model.language_model.modules())
    assert not any(isinstance(m, Int8Linear) for m in int8_model.model.visual.modules())


def test_bf16_keeps_only_the_attention_bf16_cannot_carry_in_fp32(
    loaded: Callable[[str], tuple[Any, Any]],
) -> None:
    """vlmq-tiny's first-layer recency heads (q/k biases ~58) put a bf16 logit error of ~2.4 nats on
    layer 0; the other layers' are ~1e-4. Only layer 0's attention (and the rotary table) stay fp32."""
    errors = [bf16_logit_error(layer.self_attn) for layer in loaded("none")[0].model.language_model.layers]
    assert errors[0] > 2.0 and max(errors[1:]) < 0.01
    model = loaded("bf16")[0]
    text = model.model.language_model
    fp32 = {name for name, p in model.named_parameters() if p.dtype == torch.float32}
    assert fp32 == {
        f"model.language_model.layers.0.self_attn.{n}" for n, _ in text.layers[0].self_attn.named_parameters()
    }
    assert text.rotary_emb.inv_freq.dtype == torch.float32
    assert model.lm_head.weight.dtype == torch.bfloat16 == model.model.visual.patch_embed.proj.weight.dtype


def test_fp32_island_returns_bf16_and_rounds_nothing_it_keeps(
    loaded: Callable[[str], tuple[Any, Any]],
) -> None:
    reference = loaded("none")[0].model.language_model.layers[0].self_attn
    kept = loaded("bf16")[0].model.language_model.layers[0].self_attn
    assert torch.equal(kept.q_proj.bias, reference.q_proj.bias)  # exact: no trip through bf16
    hidden = torch.randn(2, 5, 128, dtype=torch.bfloat16)
    cos_sin = (torch.ones(2, 5, 16), torch.zeros(2, 5, 16))  # fp32 from the fp32 rotary table
    with torch.inference_mode():
        out, _ = kept(hidden, position_embeddings=cos_sin, attention_mask=None)
    assert out.dtype == torch.bfloat16
