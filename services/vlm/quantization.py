"""Weight quantization shared by the engine and the evaluation: ``VLMQ_QUANTIZE=none|bf16|int8|int4``.

What each mode does to the language model's linear layers (attention and MLP projections):

- ``none``: fp32 as saved.
- ``bf16``: the whole model cast to bfloat16 (CPU and CUDA).
- ``int8``: CPU: ``Int8Linear`` below, int8 weights with per-output-channel scales and int8
  activations with one scale *per row* (token), multiplied with ``torch._int_mm``. Per-row
  scales keep a token's output independent of what else is in the batch (torch's dynamic
  quantization uses one scale per tensor, so batching would change answers).
  CUDA: bitsandbytes ``Linear8bitLt`` (LLM.int8()).
- ``int4``: bitsandbytes NF4 ``Linear4bit`` (weights only, fp32 compute), CPU and CUDA.

The vision encoder, embeddings and ``lm_head`` stay in full precision: they are a small share
of the weights and the answer is read off ``lm_head`` directly.
"""

from enum import StrEnum
from typing import Any

import torch
from torch import nn


class QuantizeMode(StrEnum):
    NONE = "none"
    BF16 = "bf16"
    INT8 = "int8"
    INT4 = "int4"


class Int8Linear(nn.Module):
    """W8A8 linear layer for CPU: per-output-channel weight scales, per-row activation scales."""

    qweight_t: torch.Tensor
    weight_scale: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach().float()
        scale = weight.abs().amax(dim=1).clamp(min=1e-8) / 127.0
        qweight = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        # Stored transposed and contiguous: _int_mm wants (in, out) on the right.
        self.register_buffer("qweight_t", qweight.t().contiguous())
        self.register_buffer("weight_scale", scale)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape, dtype = x.shape, x.dtype
        rows = x.reshape(-1, self.in_features).float()
        row_scale = rows.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / 127.0
        qrows = torch.round(rows / row_scale).clamp(-127, 127).to(torch.int8)
        out = _int8_matmul(qrows, self.qweight_t).float() * row_scale * self.weight_scale
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*shape[:-1], self.out_features).to(dtype)


def _int8_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """int8 x int8 -> int32; falls back to an exact int32 matmul where _int_mm refuses a shape."""
    try:
        return torch._int_mm(a, b)
    except RuntimeError:
        return a.to(torch.int32) @ b.to(torch.int32)


def _language_linears(model: nn.Module) -> list[tuple[nn.Module, str, nn.Linear]]:
    """(parent, attribute, layer) for every nn.Linear inside the language model's decoder layers."""
    found = []
    for name, module in model.named_modules():
        if "visual" in name or "lm_head" in name or "language_model" not in name:
            continue
        for child_name, child in module.named_children():
            if isinstance(child, nn.Linear):
                found.append((module, child_name, child))
    return found


def _bnb_int4(linear: nn.Linear, device: str) -> nn.Module:
    import bitsandbytes as bnb

    layer = bnb.nn.Linear4bit(
        linear.in_features,
        linear.out_features,
        bias=linear.bias is not None,
        compute_dtype=torch.float32,
        quant_type="nf4",
        device="cpu",
    )
    layer.weight = bnb.nn.Params4bit(
        linear.weight.detach().float().cpu(), requires_grad=False, quant_type="nf4"
    )
    if linear.bias is not None:
        layer.bias = nn.Parameter(linear.bias.detach().float().cpu(), requires_grad=False)
    # Params4bit quantizes when moved to a device; CPU needs the explicit call.
    return layer.to(device) if device != "cpu" else _quantize_bnb_on_cpu(layer)


def _quantize_bnb_on_cpu(layer: nn.Module) -> nn.Module:
    weight: Any = layer.weight
    if not getattr(weight, "bnb_quantized", False):
        layer.weight = weight._quantize("cpu")
    return layer


def _bnb_int8_cuda(linear: nn.Linear, device: str) -> nn.Module:
    import bitsandbytes as bnb

    layer = bnb.nn.Linear8bitLt(
        linear.in_features, linear.out_features, bias=linear.bias is not None, has_fp16_weights=False
    )
    layer.weight = bnb.nn.Int8Params(
        linear.weight.detach().cpu(), requires_grad=False, has_fp16_weights=False
    )
    if linear.bias is not None:
        layer.bias = nn.Parameter(linear.bias.detach().cpu(), requires_grad=False)
    return layer.to(device)


def quantize_model(model: nn.Module, mode: QuantizeMode | str, device: str = "cpu") -> nn.Module:
    """Quantize ``model`` in place for ``mode`` and move it to ``device``; returns the model."""
    mode = QuantizeMode(mode)
    if mode is QuantizeMode.NONE:
        return model.to(device)
    if mode is QuantizeMode.BF16:
        return model.to(device=device, dtype=torch.bfloat16)
    on_cuda = device.startswith("cuda")
    for parent, attr, linear in _language_linears(model):
        if mode is QuantizeMode.INT4:
            replacement = _bnb_int4(linear, device)
        elif on_cuda:
            replacement = _bnb_int8_cuda(linear, device)
        else:
            replacement = Int8Linear(linear)
        setattr(parent, attr, replacement)
    return model.to(device)


def model_size_bytes(model: nn.Module) -> int:
    """Bytes held by parameters and buffers (quantized weights count at their packed size)."""
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)
