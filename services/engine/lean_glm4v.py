"""The GLM-4V text decoder's forward without HF's per-module wrappers: the same ops, in the same order.

A decode step of the bundled model spends most of its CPU outside arithmetic: ``nn.Module`` call
dispatch (~60 module calls a step), HF's decorators (kwarg deprecation, output capture, config
defaults), per-layer attention-interface lookups and output dataclasses. This runs the decoder
layers as plain function calls over the model's own parameters and HF's own functions (causal mask,
rotary embedding, attention interface; the rotary application and a masked SDPA call regrouped
exactly, see ``_Rotary`` and ``_masked_sdpa``), so the logits are bit-identical to the model's
forward (tests/services/engine/test_lean_glm4v.py checks prefill and decode, padded rows, on the CPU).

Used only where that holds: a ``Glm4vTextModel`` whose RMSNorms and MLPs are HF's classes, and, at
each forward, no forward hook anywhere in the language model (bf16-mixed mode casts through hooks; a
test may probe a layer): the model's own forward then.
Linear layers that are not ``nn.Linear`` (int8, int4) are called as modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.cache_utils import DynamicCache
from transformers.masking_utils import create_causal_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.glm4v import modeling_glm4v as glm


class LeanGlm4vText:
    """``forward(embeds, mask, positions, cache)``: last-position logits, as the model's own forward."""

    def __init__(self, model: Any) -> None:
        self.text = model.model.language_model
        self.lm_head = _Linear.of(model.lm_head)
        self.norm = _Norm.of(self.text.norm)
        self.layers = [_Layer.of(layer) for layer in self.text.layers]  # plain fields: no module lookups
        self._modules = [*self.text.modules(), *model.lm_head.modules()]
        self._swaps = _PairSwaps()

    @staticmethod
    def supports(model: Any) -> bool:
        text = getattr(getattr(model, "model", None), "language_model", None)
        if type(text) is not glm.Glm4vTextModel or not isinstance(getattr(model, "lm_head", None), nn.Module):
            return False
        layers: Any = text.layers
        layers_ok = all(
            type(layer.mlp) is glm.Glm4vTextMLP and all(type(n) is glm.Glm4vRMSNorm for n in _norms(layer))
            for layer in layers
        )
        return layers_ok and type(text.norm) is glm.Glm4vRMSNorm

    def usable(self) -> bool:
        """No forward hook is set now (bf16-mixed casts, a test's probe, a debugger): plain calls would
        skip it, so the model's own forward runs instead. ~10 us a forward."""
        return not self.text.training and not _hooked(self._modules)  # training: dropout may apply

    def forward(
        self, embeds: torch.Tensor, mask: torch.Tensor | None, positions: torch.Tensor, cache: DynamicCache
    ) -> torch.Tensor:
        text = self.text
        if positions.ndim == 2:  # as Glm4vTextModel: one position row for all three M-RoPE axes
            positions = positions[None, ...].expand(3, positions.shape[0], -1)
        causal_mask = create_causal_mask(
            config=text.config, inputs_embeds=embeds, attention_mask=mask, cache=cache, position_ids=None
        )
        cos, sin = text.rotary_emb(embeds, position_ids=positions)
        rotary = _Rotary.of(cos, sin, self._swaps)
        # looked up per forward, as HF does: the model's attention implementation may be switched
        implementation = text.config._attn_implementation
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, glm.eager_attention_forward)
        if implementation == "sdpa" and _shared_bool_mask(causal_mask):
            attention = _masked_sdpa  # HF's SDPA call without its per-call work; the mask converted once
            causal_mask = _additive(causal_mask, embeds.dtype)
        step = _Step(rotary, causal_mask, cache, attention)
        hidden = embeds
        for layer in self.layers:
            hidden = _decoder_layer(layer, hidden, step)
        hidden = self.norm(hidden)
        return self.lm_head(hidden[:, -1:, :])[:, -1]


@dataclass(frozen=True)
class _Step:
    """What every layer of one forward shares."""

    rotary: _Rotary  # of the M-RoPE positions
    mask: torch.Tensor | None
    cache: DynamicCache
    attention: Any  # HF's attention interface for the model's implementation


def _decoder_layer(layer: _Layer, hidden: torch.Tensor, step: _Step) -> torch.Tensor:
    """``Glm4vTextDecoderLayer.forward``, op for op."""
    residual = hidden
    hidden = layer.input_norm(hidden)
    hidden = _attend(layer, hidden, step)
    hidden = layer.post_attn_out_norm(hidden)
    hidden = residual + hidden
    residual = hidden
    hidden = layer.pre_mlp_norm(hidden)
    up_states = layer.gate_up(hidden)  # Glm4vTextMLP.forward
    gate, up_states = up_states.chunk(2, dim=-1)
    up_states = up_states * layer.activation(gate)
    hidden = layer.down(up_states)
    hidden = layer.post_mlp_norm(hidden)
    return residual + hidden


def _attend(layer: _Layer, hidden: torch.Tensor, step: _Step) -> torch.Tensor:
    """``Glm4vTextAttention.forward``, op for op."""
    bsz, q_len, _ = hidden.size()
    query = layer.q(hidden)
    key = layer.k(hidden)
    value = layer.v(hidden)
    query = query.view(bsz, q_len, -1, layer.head_dim).transpose(1, 2)
    key = key.view(bsz, q_len, -1, layer.head_dim).transpose(1, 2)
    value = value.view(bsz, q_len, -1, layer.head_dim).transpose(1, 2)
    query, key = step.rotary.apply(query), step.rotary.apply(key)
    key, value = step.cache.update(key, value, layer.index)
    if step.attention is _masked_sdpa:
        out, _ = _masked_sdpa(layer, query, key, value, step.mask)
    else:
        out, _ = step.attention(layer.attn, query, key, value, step.mask, dropout=0.0, scaling=layer.scaling)
    out = out.reshape(bsz, q_len, -1).contiguous()
    return layer.o(out)


def _shared_bool_mask(mask: torch.Tensor | None) -> bool:
    """A boolean (B, 1, q, kv) mask, the same for every head: what ``_masked_sdpa`` takes."""
    return mask is not None and mask.dtype == torch.bool and mask.ndim == 4 and mask.shape[1] == 1


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The boolean mask as SDPA turns it into scores to add (0 / -inf, in the query dtype) on every
    call: once a forward instead of once a layer."""
    scores = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return scores.masked_fill_(mask.logical_not(), float("-inf"))


def _masked_sdpa(
    layer: _Layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, None]:
    """HF's ``sdpa_attention_forward`` for a masked call (``_shared_bool_mask``, made additive), the
    same kernel on the same numbers: one query token packs its query heads on the key/value heads as
    HF's ``pack_gqa`` does; longer queries copy the keys and values per query head (``repeat_kv``) as
    HF does, except on the CPU, whose fused kernel maps query heads to key/value heads itself
    (``enable_gqa``) with a mask too and computes the same numbers (the bit-identity test checks a
    padded prefill); CUDA's masked kernels do not take grouped heads (HF's ``use_gqa_in_sdpa``)."""
    q_len, groups = query.shape[2], layer.kv_groups
    gqa = groups > 1 and q_len > 1 and query.device.type == "cpu"
    if groups > 1 and q_len == 1:
        query = query.reshape(query.shape[0], query.shape[1] // groups, groups, query.shape[-1])
    elif groups > 1 and not gqa:
        key, value = glm.repeat_kv(key, groups), glm.repeat_kv(value, groups)
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=0.0, scale=layer.scaling, is_causal=False, enable_gqa=gqa
    )
    out = out.reshape(out.shape[0], -1, q_len, value.shape[-1])
    return out.transpose(1, 2).contiguous(), None


@dataclass(frozen=True)
class _Rotary:
    """HF's ``apply_rotary_pos_emb`` for one forward, with what its layers share made once.

    HF computes ``x_rot * cos + rotate_half_llm(x_rot) * sin`` on the first ``cos.shape[-1]`` channels
    and concatenates the rest. ``rotate_half_llm`` swaps each channel pair and negates the first of
    each: ``x_rot[..., swap] * sign``. Since ``(-a) * s == a * (-s)`` exactly in IEEE arithmetic, the
    sign goes into ``sin`` once per forward, and each call is one ``index_select`` and the same
    multiplications and addition: bit-identical, half the ops (each layer rotates queries and keys)."""

    cos: torch.Tensor  # (B, 1, q, rotary_dim)
    signed_sin: torch.Tensor  # sin with each pair's first channel negated
    swap: torch.Tensor  # channel order [1, 0, 3, 2, ...]

    @staticmethod
    def of(cos: torch.Tensor, sin: torch.Tensor, swaps: _PairSwaps) -> _Rotary:
        swap, sign = swaps.get(cos.shape[-1], cos.device, cos.dtype)
        return _Rotary(cos.unsqueeze(1), sin.unsqueeze(1) * sign, swap)

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        dim = self.cos.shape[-1]
        x_rot, x_pass = x[..., :dim], x[..., dim:]
        x_embed = (x_rot * self.cos) + (x_rot.index_select(-1, self.swap) * self.signed_sin)
        return torch.cat([x_embed, x_pass], dim=-1)


class _PairSwaps:
    """The channel-pair swap and sign of ``rotate_half_llm`` per (width, device, dtype), made once."""

    def __init__(self) -> None:
        self._made: dict[tuple[int, torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    def get(self, dim: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        key = (dim, device, dtype)
        if key not in self._made:
            swap = torch.arange(dim, device=device).view(-1, 2).flip(-1).flatten()
            sign = torch.tensor([-1.0, 1.0] * (dim // 2), device=device, dtype=dtype)
            self._made[key] = (swap, sign)
        return self._made[key]


@dataclass(frozen=True)
class _Linear:
    """``nn.Linear`` as ``F.linear`` on its parameters; any other linear (int8, int4) as its module."""

    weight: torch.Tensor | None
    bias: torch.Tensor | None
    module: Any

    @staticmethod
    def of(layer: Any) -> _Linear:
        if type(layer) is nn.Linear:
            return _Linear(layer.weight, layer.bias, None)
        return _Linear(None, None, layer)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.module is not None:
            return self.module(x)  # type: ignore[no-any-return]
        assert self.weight is not None
        return F.linear(x, self.weight, self.bias)


@dataclass(frozen=True)
class _Norm:
    weight: torch.Tensor
    eps: float

    @staticmethod
    def of(norm: Any) -> _Norm:
        return _Norm(norm.weight, norm.variance_epsilon)

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """``Glm4vRMSNorm.forward``, op for op."""
        input_dtype = hidden.dtype
        fp32 = input_dtype == torch.float32  # ``.to`` is a dispatched op even when it changes nothing
        hidden = hidden if fp32 else hidden.to(torch.float32)
        variance = hidden.pow(2).mean(-1, keepdim=True)
        hidden = hidden * torch.rsqrt(variance + self.eps)
        return self.weight * (hidden if fp32 else hidden.to(input_dtype))


@dataclass(frozen=True)
class _Layer:
    """One decoder layer's parameters and settings as plain fields."""

    attn: Any  # the attention module: the attention interface reads its settings
    index: int
    head_dim: int
    kv_groups: int  # query heads per key/value head
    scaling: float
    q: _Linear
    k: _Linear
    v: _Linear
    o: _Linear
    gate_up: _Linear
    down: _Linear
    activation: Any
    input_norm: _Norm
    post_attn_out_norm: _Norm
    pre_mlp_norm: _Norm
    post_mlp_norm: _Norm

    @staticmethod
    def of(layer: Any) -> _Layer:
        attn, mlp = layer.self_attn, layer.mlp
        norms = [_Norm.of(n) for n in _norms(layer)]
        return _Layer(
            attn=attn,
            index=attn.layer_idx,
            head_dim=attn.head_dim,
            kv_groups=attn.num_key_value_groups,
            scaling=attn.scaling,
            q=_Linear.of(attn.q_proj),
            k=_Linear.of(attn.k_proj),
            v=_Linear.of(attn.v_proj),
            o=_Linear.of(attn.o_proj),
            gate_up=_Linear.of(mlp.gate_up_proj),
            down=_Linear.of(mlp.down_proj),
            activation=mlp.activation_fn,
            input_norm=norms[0],
            post_attn_out_norm=norms[1],
            pre_mlp_norm=norms[2],
            post_mlp_norm=norms[3],
        )


def _norms(layer: Any) -> list[Any]:
    names = ("input_layernorm", "post_self_attn_layernorm", "post_attention_layernorm", "post_mlp_layernorm")
    return [getattr(layer, n, None) for n in names]


def _hooked(modules: list[nn.Module]) -> bool:
    """Any forward hook, global or on one of ``modules``."""
    from torch.nn.modules import module as torch_module

    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in modules)
