"""The lean GLM-4V text forward: logits and KV bit-identical to the model's own forward (fp32, int8, int4)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from bench.common import load_bundled
from services.engine.architectures import Architecture
from services.engine.kv import cache_layers


def _steps(arch: Architecture) -> list[torch.Tensor]:
    """Logits of a padded two-row prefill, then two decode steps (4-D mask, then none after a trim)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(12, arch.vocab_size, (2, 9), generator=g)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, :3] = False  # the second row is shorter: left padding
    positions = torch.arange(9).expand(3, 2, 9).clone()
    cache = arch.make_cache(None)
    out = [arch.forward(arch.embed(ids), mask, positions, cache)]
    for step in range(2):
        nxt = out[-1].argmax(-1, keepdim=True)
        mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.bool)], dim=1)
        pos = torch.full((3, 2, 1), 9 + step)
        out.append(arch.forward(arch.embed(nxt), mask[:, None, None, :], pos, cache))
    out += [t for kv in cache_layers(cache) for t in kv]
    return out


@pytest.mark.parametrize("quantize", ["none", "int8", "int4"])
def test_lean_forward_is_bit_identical(bundled: tuple[Any, Any], quantize: str) -> None:
    model, processor = bundled if quantize == "none" else load_bundled(quantize)
    lean, plain = Architecture(model, processor, lean=True), Architecture(model, processor)
    assert lean.lean is not None and plain.lean is None
    for a, b in zip(_steps(lean), _steps(plain), strict=True):
        assert torch.equal(a, b)


def test_hooked_models_keep_the_model_forward(bundled: tuple[Any, Any]) -> None:
    """Forward hooks (bf16-mixed mode's casts, a probe set later) would be skipped by plain calls."""
    bf16 = Architecture(*load_bundled("bf16"), lean=True)
    assert bf16.lean is not None and not bf16.lean.usable()
    arch = Architecture(*bundled, lean=True)
    assert arch.lean is not None and arch.lean.usable()
    handle = arch.lean.text.layers[0].register_forward_hook(lambda *_: None)
    try:
        assert not arch.lean.usable()
    finally:
        handle.remove()
    assert arch.lean.usable()


def test_other_architectures_keep_the_model_forward(tiny_models: dict[str, tuple[Any, Any]]) -> None:
    for name in ("qwen2_vl", "llava"):
        assert Architecture(*tiny_models[name], lean=True).lean is None
    assert Architecture(*tiny_models["glm4v"], lean=True).lean is not None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rotary_dim", [16, 32])
def test_regrouped_rotary_is_bit_identical_to_hf(dtype: torch.dtype, rotary_dim: int) -> None:
    """The sign folded into ``sin`` and the pair swap as an ``index_select`` give HF's exact bits,
    on partial and full rotary widths, with negative zeros and large values in the mix."""
    from transformers.models.glm4v import modeling_glm4v as glm

    from services.engine.lean_glm4v import _PairSwaps, _Rotary

    g = torch.Generator().manual_seed(1)
    q = (torch.randn(3, 4, 7, 32, generator=g) * 1e3).to(dtype)
    k = torch.randn(3, 2, 7, 32, generator=g).to(dtype)
    q[0, 0, 0, :4] = -0.0
    cos = torch.randn(3, 7, rotary_dim, generator=g).to(dtype)
    sin = torch.randn(3, 7, rotary_dim, generator=g).to(dtype)
    want_q, want_k = glm.apply_rotary_pos_emb(q, k, cos, sin)
    rotary = _Rotary.of(cos, sin, _PairSwaps())
    for got, want in ((rotary.apply(q), want_q), (rotary.apply(k), want_k)):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(
            got.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
            want.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
        )
