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
