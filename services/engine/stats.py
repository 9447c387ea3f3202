"""Counters the engine exports (the service maps them to Prometheus ``vlmq_*`` metrics)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from services.engine.caches import CacheStats


@dataclass
class EngineStats:
    running: int = 0
    waiting: int = 0
    max_batch: int = 0
    healthy: bool = True
    steps: int = 0
    prefill_steps: int = 0
    decode_steps: int = 0
    mixed_steps: int = 0  # prefill steps whose forward also stepped running sequences
    batch_sizes: dict[int, int] = field(default_factory=dict)  # decode batch size -> steps
    prefill_sizes: dict[int, int] = field(default_factory=dict)  # sequences prefilled together -> steps
    forward_cpu_s: float = 0.0  # engine-thread CPU inside prefill/decode (vision, forwards, KV)
    step_cpu_s: float = 0.0  # engine-thread CPU of whole steps (scheduling, sampling, events too)
    prompt_cpu_s: float = 0.0  # engine-thread CPU rendering submitted prompts (outside the steps)
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix/session cache
    generated_tokens: int = 0
    submitted: int = 0  # accepted by submit (a prompt refused later counts here and in finished)
    rejected: int = 0  # refused: by submit, by ``validate``, or on the engine thread (finished "rejected")
    finished: dict[str, int] = field(default_factory=dict)  # finish reason -> count
    errors: int = 0  # sequences failed by a step, or by an error rendering their prompt
    failed_steps: int = 0  # steps in a row in which every sequence failed (a step that runs resets it)
    caches: dict[str, CacheStats] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # nested CacheStats become dicts too
