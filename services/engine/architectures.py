"""What the engine needs to know about one VLM architecture, behind one small class.

Two families cover Qwen2-VL, GLM-4V (and the bundled vlmq-tiny) and Llava:
- *grid* models take ``pixel_values`` of flattened patches plus ``image_grid_thw`` and use 3-D M-RoPE
  positions (``get_rope_index``); an image becomes ``t*h*w / merge**2`` placeholder tokens.
- *fixed* models (Llava) take ``(1, C, S, S)`` pixels, give a fixed token count per image, 1-D positions.
The engine always passes ``inputs_embeds`` and explicit ``position_ids``, so the model's own mutable
``rope_deltas`` is never read or written by engine forwards.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from services.engine.api import ImageInput, RequestRejected
from services.engine.kv_layer import GrowingLayer
from services.engine.lean_glm4v import LeanGlm4vText
from services.engine.lean_glm4v_vision import LeanGlm4vVision
from services.engine.mrope import grid_positions

HEX_DIGITS = frozenset("0123456789abcdef")


class Architecture:
    """One loaded model as the engine sees it: embeddings, image features, positions, forward, KV."""

    def __init__(self, model: Any, processor: Any, lean: bool = False) -> None:
        self.model = model
        self.base = getattr(model, "model", model)
        self.config = model.config
        self.text_config = model.config.get_text_config(decoder=True)
        self.vision_config: Any = getattr(model.config, "vision_config", None)
        self.image_token_id = int(model.config.image_token_id)
        self.grid = hasattr(self.base, "get_rope_index")
        self.embed_tokens = model.get_input_embeddings()
        self.tokenizer = getattr(processor, "tokenizer", processor)
        if not self.grid and not hasattr(self.vision_config, "image_size"):
            raise ValueError(f"unsupported VLM architecture: {type(model).__name__}")
        self.lean = LeanGlm4vText(model) if lean and LeanGlm4vText.supports(model) else None
        self.lean_vision = LeanGlm4vVision(model) if lean and LeanGlm4vVision.supports(model) else None
        self.quick_positions = self.grid and self._grid_positions_match()
        config_layers = DynamicCache(config=self.config).layers  # the cache layers the config asks for
        self._num_kv_layers = len(config_layers)
        self._full_attention = all(type(layer) is DynamicLayer for layer in config_layers)

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @property
    def vocab_size(self) -> int:
        """Width of the logits (may exceed the tokenizer's length: padded vocabularies)."""
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def merge(self) -> int:
        return int(getattr(self.vision_config, "spatial_merge_size", 1))

    def eos_token_ids(self) -> set[int]:
        ids: set[int] = set()
        for src in (getattr(self.model, "generation_config", None), self.tokenizer):
            eos = getattr(src, "eos_token_id", None)
            ids.update([eos] if isinstance(eos, int) else list(eos or []))
        return ids

    def kv_bytes_per_token(self) -> int:
        tc = self.text_config
        heads = getattr(tc, "num_key_value_heads", None) or tc.num_attention_heads
        head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
        return 2 * tc.num_hidden_layers * heads * head_dim * self.dtype.itemsize

    # --- images ---------------------------------------------------------------------------------
    def tokens_per_image(self, image: ImageInput) -> int:
        if self.grid:
            return int(image.image_grid_thw.prod()) // self.merge**2
        vc = self.vision_config
        n = (vc.image_size // vc.patch_size) ** 2
        return n + (1 if getattr(self.config, "vision_feature_select_strategy", "default") == "full" else 0)

    def check_image(self, image: ImageInput, index: int) -> None:
        """Refuse tensors the vision encoder would choke on (or silently misread)."""
        pv = image.pixel_values
        where = f"image {index}"
        if pv is None and image.deferred is not None and self.grid:
            pass  # made when encoded, finite by its maker's contract; its shape is checked below
        elif not isinstance(pv, torch.Tensor) or not pv.is_floating_point():
            raise RequestRejected(f"{where}: pixel_values must be a floating-point tensor")
        elif not torch.isfinite(pv.sum()):  # NaN/Inf anywhere reach the sum: one pass, no bool copy
            raise RequestRejected(f"{where}: pixel_values contain NaN or Inf (or overflow float32)")
        if len(image.digest) != 64 or not HEX_DIGITS.issuperset(image.digest):
            raise RequestRejected(f"{where}: digest must be the full sha256 hex of the image bytes")
        (self._check_grid if self.grid else self._check_fixed)(image, where)

    def _check_grid(self, image: ImageInput, where: str) -> None:
        vc, grid, shape = self.vision_config, image.image_grid_thw, _pixels_shape(image)
        thw = grid[0].tolist() if grid.shape == (1, 3) else []  # one conversion, not one per element
        if not thw or min(thw) <= 0:
            raise RequestRejected(f"{where}: image_grid_thw must have shape (1, 3) with positive values")
        t, h, w = (int(v) for v in thw)
        if h % self.merge or w % self.merge:
            raise RequestRejected(f"{where}: grid {h}x{w} not divisible by merge size {self.merge}")
        channels = getattr(vc, "in_channels", None) or getattr(vc, "in_chans", 3)
        dim = channels * vc.temporal_patch_size * vc.patch_size**2
        if shape != (t * h * w, dim):
            raise RequestRejected(f"{where}: pixel_values shape {shape} != {(t * h * w, dim)} for grid {thw}")

    def _check_fixed(self, image: ImageInput, where: str) -> None:
        vc, shape = self.vision_config, _pixels_shape(image)
        want = (1, getattr(vc, "num_channels", 3), vc.image_size, vc.image_size)
        if shape != want:
            raise RequestRejected(f"{where}: pixel_values shape {shape} != {want}")

    def _pixel_values(self, image: ImageInput) -> torch.Tensor:
        if image.pixel_values is not None:
            return image.pixel_values
        assert image.deferred is not None  # check_image refuses an image with neither
        return image.deferred.make(self.device)

    @torch.inference_mode()
    def encode_images(self, images: list[ImageInput]) -> list[torch.Tensor]:
        """Vision encoder over several images at once; one (tokens, hidden) tensor per image."""
        # each image on the device first: made there (``deferred``) or uploaded (one batch may hold both)
        pv = torch.cat([self._pixel_values(im).to(self.device, self.dtype) for im in images])
        if self.grid:
            grid = torch.cat([im.image_grid_thw for im in images]).to(self.device)
            if self.lean_vision is not None and self.lean_vision.usable():
                merged = self.lean_vision.features(pv, grid).to(self.dtype)
                return list(torch.split(merged, [self.tokens_per_image(im) for im in images]))
            out = self.base.get_image_features(pixel_values=pv, image_grid_thw=grid)
        else:
            out = self.base.get_image_features(
                pixel_values=pv,
                vision_feature_layer=self.config.vision_feature_layer,
                vision_feature_select_strategy=self.config.vision_feature_select_strategy,
            )
        feats = getattr(out, "pooler_output", out)
        flat = torch.cat(list(feats)) if isinstance(feats, list | tuple) else feats
        flat = flat.reshape(-1, flat.shape[-1]).to(self.dtype)
        return list(torch.split(flat, [self.tokens_per_image(im) for im in images]))

    # --- positions ------------------------------------------------------------------------------
    def positions(self, ids: list[int], images: list[ImageInput]) -> torch.Tensor:
        """Per-token positions of a whole prompt: (3, N) for M-RoPE models, (N,) otherwise."""
        n = len(ids)
        if not self.grid:
            return torch.arange(n)
        if not images:
            return torch.arange(n).expand(3, n).clone()
        if self.quick_positions:
            grids = [row for im in images for row in im.image_grid_thw.tolist()]
            quick = grid_positions(ids, grids, self.image_token_id, self.merge)
            if quick is not None:
                return quick
        return self._rope_index(ids, images)

    def _rope_index(self, ids: list[int], images: list[ImageInput]) -> torch.Tensor:
        """The model's own ``get_rope_index`` positions (3, N) of one prompt."""
        t = torch.tensor([ids])
        grid = torch.cat([im.image_grid_thw for im in images])
        pos, _ = self.base.get_rope_index(
            t, mm_token_type_ids=(t == self.image_token_id).int(), image_grid_thw=grid
        )
        return pos[:, 0, :].cpu()

    def _grid_positions_match(self) -> bool:
        """``grid_positions`` equals ``get_rope_index`` on a probe prompt: text, two images of other
        shapes, text between and after (else every prompt goes through ``get_rope_index``)."""
        m, tok = self.merge, self.image_token_id
        shapes = [(1, 2 * m, 3 * m), (1, 3 * m, m)]
        images = [ImageInput(torch.zeros(0), torch.tensor([list(s)]), "") for s in shapes]
        ids = [tok + 1, tok + 2, *[tok] * 6, tok + 3, *[tok] * 3, tok + 4, tok + 5]
        try:
            expected = self._rope_index(ids, images)
        except Exception:  # a model whose positions need more than this: keep its own
            return False
        quick = grid_positions(ids, [list(s) for s in shapes], tok, m)
        return quick is not None and torch.equal(quick, expected)

    # --- forward --------------------------------------------------------------------------------
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(ids.to(self.device))

    def make_cache(
        self, layers: list[tuple[torch.Tensor, torch.Tensor]] | None = None, filled: int | None = None
    ) -> DynamicCache:
        """A DynamicCache holding ``layers`` as they are (no copy: the constructor's own path would cat).
        With ``filled``, the layers are buffers made for this cache (``spare_buffer``) whose first
        ``filled`` columns hold the KV: later tokens are written into the rest."""
        assert self._full_attention, "full-attention layers only"
        cache = DynamicCache()  # not from the config: that reads it per layer (~0.1 ms), known already
        growing = [GrowingLayer() for _ in range(self._num_kv_layers)]  # decode steps append in place
        cache.layers = list(growing)
        for layer, (k, v) in zip(growing, layers or [], strict=False):
            if filled is not None:
                layer.adopt(k, v, filled)
                continue
            layer.lazy_initialization(k, v)
            layer.keys, layer.values = k, v
        return cache

    @torch.inference_mode()
    def forward(
        self, embeds: torch.Tensor, mask: torch.Tensor | None, positions: torch.Tensor, cache: DynamicCache
    ) -> torch.Tensor:
        """One forward over (B, q) embeddings; returns the last position's logits (B, V) in fp32.
        ``mask``: (B, cached + q) bool, True for real tokens, or a ready (B, 1, q, cached + q) mask, or
        None (no padding anywhere); ``positions`` (3, B, q) or (B, q)."""
        mask = None if mask is None else mask.to(self.device)
        if self.lean is not None and self.lean.usable():
            return self.lean.forward(embeds, mask, positions.to(self.device), cache).float()
        out = self.model(
            inputs_embeds=embeds,
            attention_mask=mask,
            position_ids=positions.to(self.device),
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1].float()


def _pixels_shape(image: ImageInput) -> tuple[int, ...]:
    """The pixel values' shape, made or to be made (``()``: neither)."""
    if image.pixel_values is not None:
        return tuple(image.pixel_values.shape)
    return tuple(image.deferred.shape) if image.deferred is not None else ()


def auto_max_batch(arch: Architecture, max_context_tokens: int) -> int:
    """CPU: 8. CUDA: as many full-context sequences as half the free memory holds (KV only)."""
    if arch.device.type != "cuda":
        return 8
    free, _ = torch.cuda.mem_get_info(arch.device)
    per_seq = arch.kv_bytes_per_token() * max_context_tokens
    return max(1, min(256, math.floor(free * 0.5 / per_seq)))
