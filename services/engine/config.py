"""Engine settings. Plain dataclass: the service builds it from its pydantic settings (VLMQ_* env)."""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024 * 1024


@dataclass(frozen=True)
class EngineConfig:
    model_path: str = "models/vlmq-tiny"
    quantize: str = "none"  # none|bf16|int8|int4 (services.vlm.quantization)
    device: str = "auto"  # auto|cpu|cuda
    max_batch: int | None = None  # None: 8 on CPU; on CUDA derived from free memory
    batch_window_ms: float = 10.0  # admission window; never delays a lone request on an idle engine
    # while sequences run, a prefill waits (at most the window) until this many slots are free and
    # waiters fill them: one prefill of several instead of one per finished sequence (each may stall
    # every decode); 0: half the batch, 1: refill every free slot at once
    prefill_min_free: int = 0
    # a prefill steps the running sequences in its own forward (their one token padded to the prompts'
    # width) while that padding stays within this many token columns (rows x (width - 1)): a few
    # padded columns cost less than a decode step of their own; 0: never
    mix_padding_tokens: int = 64
    max_context_tokens: int = 2048
    max_new_tokens_limit: int = 512
    prefix_cache: bool = True
    session_cache: bool = True
    image_cache: bool = True
    prefix_cache_bytes: int = 64 * MIB
    session_cache_bytes: int = 512 * MIB
    image_cache_bytes: int = 256 * MIB
    session_ttl_s: float = 300.0
    # encode queued requests' images on a side thread, overlapping the batch's forwards (needs a free
    # core or a GPU; on this shared 2-core CPU it measured no gain, hence off by default)
    vision_prefetch: bool = False
    # steps in a row in which every sequence failed before the engine reports unhealthy (and its worker
    # exits to be restarted); a device error (CUDA error, device-side assert) is unhealthy at once
    max_failed_steps: int = 3
    # GLM-4V text decoder and vision tower as plain function calls over their own parameters
    # (services/engine/lean_glm4v.py, lean_glm4v_vision.py: bit-identical logits and features, less
    # per-module overhead); off, or another architecture: the model's forward
    lean_forward: bool = True
    priority_aging_s: float = 10.0  # a lower-priority request waiting this long is admitted as the first
