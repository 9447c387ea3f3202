"""One request's state as it flows through the engine. The scheduler changes it, the runner reads it."""

from __future__ import annotations

import enum
import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from services.engine.api import FinishReason, GenerationRequest, TokenEvent
from services.engine.detok import Detokenizer


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(frozen=True)
class ImageSpan:
    """Where image ``index`` sits in the prompt: tokens [start, end), identified by its digest."""

    start: int
    end: int
    index: int
    digest: str


@dataclass
class Prompt:
    """A request after rendering: token ids with image placeholders expanded, and their positions."""

    token_ids: list[int]
    positions: torch.Tensor  # (3, N) M-RoPE or (N,)
    spans: list[ImageSpan]

    @functools.cached_property
    def next_position(self) -> int:
        """Position of the first generated token (text continues after the highest position). Read
        every decode step: computed once (a tensor max was ~7 % of a bundled-model decode step)."""
        return int(self.positions.max()) + 1


@dataclass(eq=False)
class Submission:
    """A request ``submit`` accepted: its prompt is rendered on the engine thread, which then makes
    it a ``Sequence`` (or refuses it with a finished event)."""

    request: GenerationRequest
    on_event: Callable[[TokenEvent], None]
    grammar: Any  # the matcher of a structured request (compiled on the submitting thread), else None
    arrival: float = field(default_factory=time.monotonic)


@dataclass(eq=False)
class Sequence:
    request: GenerationRequest
    prompt: Prompt
    on_event: Callable[[TokenEvent], None]
    detok: Detokenizer
    eos_ids: frozenset[int]
    status: Status = Status.WAITING
    arrival: float = field(default_factory=time.monotonic)
    admitted_at: float = 0.0
    first_token_at: float = 0.0
    vision_s: float = 0.0
    prefill_s: float = 0.0
    output_ids: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0
    # views of a prefix-cache entry's KV for the prompt's first tokens (the system prompt), shared by
    # this turn's session entry instead of copied into it (runner._reuse / release)
    shared_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    finish_reason: FinishReason | None = None
    error: str | None = None
    generator: torch.Generator | None = None
    grammar: Any = None  # structured output: the sequence's xgrammar matcher (grammar.py), else None
    # vision prefetch hand-over (see vision.py): features computed ahead of the prefill
    features: dict[str, torch.Tensor] = field(default_factory=dict)
    vision_state: str = "pending"
    vision_done: threading.Event = field(default_factory=threading.Event)

    @property
    def id(self) -> str:
        return self.request.request_id

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt.token_ids)

    @property
    def fed_ids(self) -> list[int]:
        """Tokens whose KV exists: the prompt and every output but the last (sampled, not yet fed)."""
        return self.prompt.token_ids + self.output_ids[:-1]

    @property
    def last_position(self) -> int:
        """Position of the last sampled token, the input of the next decode step."""
        return self.prompt.next_position + len(self.output_ids) - 1

    def expired(self, now_epoch: float) -> bool:
        return self.request.deadline is not None and now_epoch >= self.request.deadline
