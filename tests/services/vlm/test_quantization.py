"""Quantization modes: what gets replaced, sizes shrink, int8 rows do not depend on the batch."""

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from services.vlm.quantization import Int8Linear, model_size_bytes


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
