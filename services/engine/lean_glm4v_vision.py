"""The GLM-4V vision tower's forward without HF's per-module wrappers, and with what depends only on
a picture's grid computed once per grid.

The bundled model's tower is four small blocks over 36 patches a picture: most of its CPU is
Python, not arithmetic (~60 module calls, HF's decorators, config attribute lookups), and a quarter
of it rebuilds, for every call, what only the grid decides: the rotary angles, the attention
segments and the bicubic interpolation of the position embeddings. Here the blocks run as plain
calls over the model's own parameters and HF's own functions (rotary application, attention
interface), and a grid's tensors come from HF's own code once per grid (kept in a small LRU
bounded in bytes; a call's pictures' tensors are concatenated), so the features are bit-identical
to ``get_image_features`` (tests/services/engine/test_lean_glm4v_vision.py: one and several
images, several grids).

Used only where that holds: a ``Glm4vVisionModel`` with HF's block, norm and MLP classes, not
training, no forward hook on it, and an attention implementation that splits by image (not flash
attention, which takes the segments whole): the model's own forward otherwise.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.glm4v import modeling_glm4v as glm
from transformers.vision_utils import get_vision_cu_seqlens, get_vision_position_ids

from services.engine.lean_glm4v import _hooked, _Linear, _Norm

GRID_CACHE_BYTES = 32 * 1024 * 1024  # grids' tensors kept (the bundled model's one grid: 28 KB)


@dataclass(frozen=True)
class _Grid:
    """What only the images' grids decide, for one layout of grids."""

    rotary: tuple[torch.Tensor, torch.Tensor]  # (cos, sin) per patch
    position_embeddings: torch.Tensor  # the interpolated absolute position embeddings, per patch
    lengths: list[int]  # patches per attention segment (a frame of a picture)

    @property
    def nbytes(self) -> int:
        tensors = (*self.rotary, self.position_embeddings)
        return sum(t.numel() * t.element_size() for t in tensors)

    @staticmethod
    def joined(grids: list[_Grid]) -> _Grid:
        """Several pictures' tensors in order: what HF computes for them together (each patch's
        values depend on its own picture's grid only)."""
        if len(grids) == 1:
            return grids[0]
        cos = torch.cat([g.rotary[0] for g in grids])
        sin = torch.cat([g.rotary[1] for g in grids])
        table = torch.cat([g.position_embeddings for g in grids])
        return _Grid((cos, sin), table, [n for g in grids for n in g.lengths])


@dataclass(frozen=True)
class _Block:
    attn: Any  # the attention module: the attention interface reads its settings
    heads: int
    scaling: float
    norm1: _Norm
    norm2: _Norm
    qkv: _Linear
    proj: _Linear
    gate: _Linear
    up: _Linear
    down: _Linear
    activation: Any

    @staticmethod
    def of(block: Any) -> _Block:
        attn, mlp = block.attn, block.mlp
        return _Block(
            attn=attn,
            heads=attn.num_heads,
            scaling=attn.scaling,
            norm1=_Norm.of(block.norm1),
            norm2=_Norm.of(block.norm2),
            qkv=_Linear.of(attn.qkv),
            proj=_Linear.of(attn.proj),
            gate=_Linear.of(mlp.gate_proj),
            up=_Linear.of(mlp.up_proj),
            down=_Linear.of(mlp.down_proj),
            activation=mlp.act_fn,
        )


class LeanGlm4vVision:
    """``features(pixel_values, grid_thw)``: every image's merged features, concatenated, as
    ``get_image_features``'s pooler output."""

    def __init__(self, model: Any) -> None:
        self.visual = visual = model.model.visual
        self.blocks = [_Block.of(block) for block in visual.blocks]
        self.post_conv_norm = _Norm.of(visual.post_conv_layernorm)
        self.post_norm = _Norm.of(visual.post_layernorm)
        merger = visual.merger
        self.merger_proj = _Linear.of(merger.proj)
        self.merger_gate, self.merger_up = _Linear.of(merger.gate_proj), _Linear.of(merger.up_proj)
        self.merger_down = _Linear.of(merger.down_proj)
        self._modules = list(visual.modules())
        self._grids: OrderedDict[tuple[Any, ...], _Grid] = OrderedDict()
        self._lock = threading.Lock()
        self._cached_bytes = 0

    @staticmethod
    def supports(model: Any) -> bool:
        visual = getattr(getattr(model, "model", None), "visual", None)
        if type(visual) is not glm.Glm4vVisionModel:
            return False
        blocks_ok = all(
            type(b) is glm.Glm4vVisionBlock
            and type(b.mlp) is glm.Glm4VisionMlp
            and type(b.attn) is glm.Glm4vVisionAttention
            and type(b.norm1) is glm.Glm4vRMSNorm
            and type(b.norm2) is glm.Glm4vRMSNorm
            for b in visual.blocks
        )
        norms = (visual.post_conv_layernorm, visual.post_layernorm)
        return blocks_ok and all(type(n) is glm.Glm4vRMSNorm for n in norms)

    def usable(self) -> bool:
        """Not training, no forward hook now, and attention that splits by image (not flash)."""
        if self.visual.training or _hooked(self._modules):
            return False
        return not glm.is_flash_attention_requested(self.visual.config)

    def features(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """``Glm4vModel.get_image_features`` then ``Glm4vVisionModel.forward``, op for op."""
        visual = self.visual
        pixel_values = pixel_values.type(visual.dtype)
        hidden = visual.patch_embed(pixel_values)
        hidden = self.post_conv_norm(hidden)
        grid = self._grid(grid_thw, hidden)
        hidden = hidden + grid.position_embeddings  # Glm4vVisionEmbeddings.forward's sum
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(
            visual.config._attn_implementation, glm.eager_attention_forward
        )
        for block in self.blocks:
            hidden = _vision_block(block, hidden, grid, attention)
        hidden = self.post_norm(hidden)
        merge = visual.spatial_merge_size
        hidden = hidden.view(-1, merge, merge, hidden.shape[-1]).permute(0, 3, 1, 2)
        hidden = visual.downsample(hidden).view(-1, visual.config.out_hidden_size)
        return self._merge(hidden)

    def _merge(self, hidden: torch.Tensor) -> torch.Tensor:
        """``Glm4vVisionPatchMerger.forward``."""
        merger = self.visual.merger
        hidden = self.merger_proj(hidden)
        hidden = merger.act1(merger.post_projection_norm(hidden))
        return self.merger_down(merger.act_fn(self.merger_gate(hidden)) * self.merger_up(hidden))

    def _grid(self, grid_thw: torch.Tensor, hidden: torch.Tensor) -> _Grid:
        """The pictures' grid tensors, each grid's made by HF's own code the first time it is seen.
        Keyed also by the position-embedding weight's version: an in-place change to it invalidates
        the entries. The vision prefetcher and the engine thread may both be here: the table is
        locked."""
        version = self.visual.embeddings.position_embedding.weight._version
        rows = [tuple(row) for row in grid_thw.tolist()]
        return _Grid.joined([self._one_grid(row, grid_thw, hidden, version) for row in rows])

    def _one_grid(
        self, row: tuple[int, ...], grid_thw: torch.Tensor, hidden: torch.Tensor, version: int
    ) -> _Grid:
        key = (row, hidden.device, hidden.dtype, version)
        with self._lock:
            grid = self._grids.get(key)
            if grid is not None:
                self._grids.move_to_end(key)
                return grid
        one = torch.tensor([row], dtype=grid_thw.dtype, device=grid_thw.device)
        grid = self._make_grid(one, hidden.new_zeros(row[0] * row[1] * row[2], hidden.shape[-1]))
        if grid.nbytes <= GRID_CACHE_BYTES // 4:  # a huge picture's tensors are made anew each time
            with self._lock:
                self._grids[key] = grid
                self._cached_bytes += grid.nbytes
                while self._cached_bytes > GRID_CACHE_BYTES:
                    self._cached_bytes -= self._grids.popitem(last=False)[1].nbytes
        return grid

    def _make_grid(self, grid_thw: torch.Tensor, zeros: torch.Tensor) -> _Grid:
        """HF's own tensors for ``grid_thw``; ``zeros``: (patches, width) on the tower's device."""
        visual = self.visual
        position_ids = get_vision_position_ids(grid_thw, visual.spatial_merge_size)
        cu_seqlens = get_vision_cu_seqlens(grid_thw)
        seqlens = cu_seqlens[1:] - cu_seqlens[:-1]
        rotary = visual.rotary_pos_emb(zeros, position_ids)
        # The embeddings module adds the interpolated table to its input: on zeros, that is the table.
        table = visual.embeddings(
            zeros,
            seqlens,
            grid_thw,
            position_ids[:, 0].to(zeros.device),
            position_ids[:, 1].to(zeros.device),
        )
        return _Grid(rotary, table, seqlens.tolist())


def _vision_block(block: _Block, hidden: torch.Tensor, grid: _Grid, attention: Any) -> torch.Tensor:
    """``Glm4vVisionBlock.forward``, op for op."""
    hidden = hidden + _vision_attend(block, block.norm1(hidden), grid, attention)
    normed = block.norm2(hidden)
    return hidden + block.down(block.activation(block.gate(normed)) * block.up(normed))


def _vision_attend(block: _Block, hidden: torch.Tensor, grid: _Grid, attention: Any) -> torch.Tensor:
    """``Glm4vVisionAttention.forward`` (attention split by image), op for op."""
    seq_length = hidden.shape[0]
    query, key, value = (
        block.qkv(hidden).reshape(seq_length, 3, block.heads, -1).permute(1, 0, 2, 3).unbind(0)
    )
    cos, sin = grid.rotary
    query, key = glm.apply_rotary_pos_emb_vision(query, key, cos, sin)
    query = query.transpose(0, 1).unsqueeze(0)
    key = key.transpose(0, 1).unsqueeze(0)
    value = value.transpose(0, 1).unsqueeze(0)
    splits = [torch.split(t, grid.lengths, dim=2) for t in (query, key, value)]
    outputs = [
        attention(
            block.attn, q, k, v, attention_mask=None, scaling=block.scaling, dropout=0.0, is_causal=False
        )[0]
        for q, k, v in zip(*splits, strict=True)
    ]
    out = torch.cat(outputs, dim=1).reshape(seq_length, -1).contiguous()
    return block.proj(out)
