"""Weight quantization shared by the engine and the evaluation: ``VLMQ_QUANTIZE=none|bf16|int8|int4``.

What each mode does to the language model's linear layers (attention and MLP projections):

- ``none``: fp32 as saved.
- ``bf16``: mixed precision (CPU and CUDA), ``to_bf16_mixed`` below: every weight in bfloat16 except
  the attention layers whose query/key biases bf16 cannot carry, which stay fp32 with the text
  rotary embedding that feeds them.
- ``int8``: CPU: ``Int8Linear`` below, int8 weights with per-output-channel scales and int8
  activations with one scale *per row* (token), multiplied with ``torch._int_mm``. Per-row
  scales keep a token's output independent of what else is in the batch (torch's dynamic
  quantization uses one scale per tensor, so batching would change answers).
  CUDA: bitsandbytes ``Linear8bitLt`` (LLM.int8()).
- ``int4``: bitsandbytes NF4 ``Linear4bit`` (weights only, fp32 compute), CPU and CUDA.

For int8/int4 the vision encoder, embeddings and ``lm_head`` stay in full precision: they are a
small share of the weights and the answer is read off ``lm_head`` directly.

What bf16 keeps in fp32, and why. Storing the weights in bf16 costs vlmq-tiny nothing: with every
parameter rounded to bf16 and fp32 arithmetic it answers exactly like fp32 (held-out, 300
questions: 95.0 % both). Computing in bf16 is what loses (82.0 %, counting 89 -> 47 %), and only
in the first text layer's attention: kept in fp32 with fp32 rotary cos/sin, the rest bf16, gives
95.0 % again (with bf16 cos/sin 92.3 %, counting 82 %); fp32 norms, vision tower, lm_head or
rotary alone give nothing back (82.0-82.7 %); all four attention layers fp32: 95.0 %. That
attention's recency heads (``tinyvlm.referents.recency_heads``) put query/key biases of ~58 on
one slow rotary pair, so the attention logit is ~600 and its useful part, the fall with distance,
is a few nats of it. bf16 holds ~3 significant digits: q and k at 58 are off by up to 0.125, the
logit by ~2 nats, as much as the whole window. So bf16 mode keeps in fp32 each attention layer
whose bias-only logit, ``scaling * sum_i |b_q,i| * |b_k,i|`` for some head, times bf16's relative
rounding of q plus that of k (2 * 2**-9), exceeds ``BF16_LOGIT_ERROR_LIMIT`` nats (vlmq-tiny: layer 0
at 2.36, the next largest 0.0001). Any checkpoint goes through the same rule (GLM-4V and Qwen2-VL
text attention has q/k biases; fused ``qkv`` projections are not inspected). Kept layers compute
in fp32, inputs cast on the way in and outputs back to bf16 by hooks; their KV cache is fp32.
"""

import copy
from enum import StrEnum
from typing import Any

import torch
from torch import nn

# A logit error above this many nats (bf16 rounding of q and k at their bias size) moves an
# attention weight by more than ~10 %: the attention layer stays fp32 in bf16 mode.
BF16_LOGIT_ERROR_LIMIT = 0.1


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
        return to_bf16_mixed(model).to(device)
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


def bf16_logit_error(attention: nn.Module) -> float:
    """Worst head's attention-logit error (nats) from rounding q and k to bf16 at their bias size;
    0 for attention without separate, biased q/k projections."""
    q_proj, k_proj = getattr(attention, "q_proj", None), getattr(attention, "k_proj", None)
    if not isinstance(q_proj, nn.Linear) or not isinstance(k_proj, nn.Linear):
        return 0.0
    head_dim = getattr(attention, "head_dim", None)  # every HF attention module has it
    if q_proj.bias is None or k_proj.bias is None or not isinstance(head_dim, int):
        return 0.0
    scaling = float(getattr(attention, "scaling", head_dim**-0.5))
    q_bias = q_proj.bias.detach().float().abs().view(-1, head_dim)
    k_bias = k_proj.bias.detach().float().abs().view(-1, head_dim)
    k_per_q_head = k_bias.repeat_interleave(len(q_bias) // len(k_bias), dim=0)
    # bf16 keeps 8 significant bits: each of q and k is off by up to half an ulp, 2**-9 relative.
    relative = 2 * 2.0**-9
    return float((q_bias * k_per_q_head).sum(dim=1).max()) * scaling * relative


def _cast_floats(value: Any, dtype: torch.dtype) -> Any:
    """``value`` with every floating tensor in it (tuples, lists, dicts, ModelOutputs) cast to ``dtype``."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, tuple | list):
        return type(value)(_cast_floats(v, dtype) for v in value)
    if isinstance(value, dict):
        out = copy.copy(value)  # keeps a ModelOutput's class
        for key, item in value.items():
            out[key] = _cast_floats(item, dtype)
        return out
    return value


def _cast_inputs_to(module: nn.Module, dtype: torch.dtype) -> None:
    def pre_hook(_: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return _cast_floats(args, dtype), _cast_floats(kwargs, dtype)

    module.register_forward_pre_hook(pre_hook, with_kwargs=True)


def _cast_outputs_to(module: nn.Module, dtype: torch.dtype) -> None:
    module.register_forward_hook(lambda _module, _args, output: _cast_floats(output, dtype))


def _cast_all_but(model: nn.Module, kept: list[nn.Module], dtype: torch.dtype) -> None:
    """Cast every floating parameter and buffer of ``model`` to ``dtype`` except those under ``kept``
    (which keep their fp32 values exactly: no round trip through bf16)."""
    skip = {id(sub) for module in kept for sub in module.modules()}
    for module in model.modules():
        if id(module) in skip:
            continue
        for param in module.parameters(recurse=False):
            if param.is_floating_point():
                param.data = param.data.to(dtype)
        for name, buffer in module.named_buffers(recurse=False):
            if buffer.is_floating_point():
                module._buffers[name] = buffer.to(dtype)


def _language_model(model: nn.Module) -> nn.Module:
    base = getattr(model, "model", model)
    return getattr(base, "language_model", base)


def to_bf16_mixed(model: nn.Module) -> nn.Module:
    """bf16 weights, except the attention layers bf16 cannot compute faithfully (module docstring).

    Every attention of the language model casts its inputs to its own dtype: with a kept layer the
    rotary embedding stays fp32 (exact cos/sin for it), and the bf16 layers take theirs in bf16."""
    text = _language_model(model)
    attentions = [m for m in text.modules() if isinstance(getattr(m, "q_proj", None), nn.Linear)]
    kept = [m for m in attentions if bf16_logit_error(m) > BF16_LOGIT_ERROR_LIMIT]
    rotary = [m for m in text.modules() if isinstance(getattr(m, "inv_freq", None), torch.Tensor)]
    _cast_all_but(model, kept + rotary if kept else [], torch.bfloat16)
    if not kept:
        return model
    for module in rotary:  # it reads only the dtype of its input: fp32 in, fp32 cos/sin out
        _cast_inputs_to(module, torch.float32)
    for attention in attentions:
        _cast_inputs_to(attention, next(attention.parameters()).dtype)
    for attention in kept:
        _cast_outputs_to(attention, torch.bfloat16)
    return model


def model_size_bytes(model: nn.Module) -> int:
    """Bytes held by parameters and buffers (quantized weights count at their packed size)."""
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)
