"""Request validation and prompt building: ``check`` (free, on the submitting thread) and ``render``
(on the engine thread, before the request reaches the scheduler).

The conversation is rendered by the model's chat template (the whole history every turn), tokenized,
and each image placeholder token is expanded to the image's token count, exactly as the HF processor
does it for a from-scratch run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from services.engine.api import GenerationRequest, RequestRejected, SamplingParams
from services.engine.architectures import Architecture
from services.engine.config import EngineConfig
from services.engine.sequence import ImageSpan, Prompt

MAX_STOP_STRINGS = 8


@dataclass(frozen=True)
class TemplateHead:
    """What the chat template renders before any user text, and its tokens."""

    text: str
    ids: list[int]


class PromptBuilder:
    def __init__(self, arch: Architecture, processor: Any, config: EngineConfig) -> None:
        self.arch = arch
        self.processor = processor
        self.tokenizer = arch.tokenizer
        self.config = config
        self.head = self._fixed_head()  # the template's fixed opening, tokenized once (or None)

    def build(self, request: GenerationRequest) -> Prompt:
        """Validate ``request`` and return its prompt; raises RequestRejected with the reason."""
        self.check(request)
        return self.render(request)

    def check(self, request: GenerationRequest) -> None:
        """The checks that cost nothing (the engine makes them on the submitting thread)."""
        check_sampling(request.sampling, self.config)
        n_parts = count_image_parts(request.messages)
        if n_parts != len(request.images):
            raise RequestRejected(f"{len(request.images)} images given for {n_parts} image parts in messages")

    def render(self, request: GenerationRequest) -> Prompt:
        """The prompt of a ``check``ed request: image tensors checked, template rendered, tokens
        counted against the context (the engine does this on its own thread)."""
        for i, image in enumerate(request.images):
            self.arch.check_image(image, i)
        ids = self.tokenize(request.messages)
        ids, spans = self.expand_images(ids, request)
        total = len(ids) + request.sampling.max_tokens
        if total > self.config.max_context_tokens:
            raise RequestRejected(
                f"prompt of {len(ids)} tokens + max_tokens {request.sampling.max_tokens} exceeds the "
                f"context of {self.config.max_context_tokens} tokens"
            )
        return Prompt(ids, self.arch.positions(ids, request.images), spans)

    def tokenize(self, messages: list[dict[str, Any]]) -> list[int]:
        try:
            text = self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # template errors are the caller's malformed messages
            raise RequestRejected(f"messages could not be rendered by the chat template: {exc}") from exc
        if self.head is not None and text.startswith(self.head.text):
            return self.head.ids + self._ids(text[len(self.head.text) :], add_special=False)
        return self._ids(text)

    def _ids(self, text: str, add_special: bool | None = None) -> list[int]:
        """Like ``processor(text=...)``: special tokens (e.g. Llama's BOS) unless the template wrote them."""
        if add_special is None:
            bos = getattr(self.tokenizer, "bos_token", None)
            add_special = not (bos and text.startswith(bos))
        return list(self.tokenizer(text, add_special_tokens=add_special)["input_ids"])

    def _fixed_head(self) -> TemplateHead | None:
        """What the chat template renders before any user text (the default system prompt), cut after
        its last special token, with its tokens: a rendered prompt that starts with it tokenizes only
        the rest (a special token is a boundary the tokenizer never merges across). Only where two
        probe conversations tokenize the same both ways; None otherwise."""
        added = getattr(self.tokenizer, "added_tokens_decoder", None) or {}
        specials = [str(t.content) for t in added.values() if getattr(t, "special", False)]
        try:
            probes = [self._rendered(text) for text in ("a", "b b")]
        except Exception:  # a template that needs more than a user turn: tokenize whole prompts
            return None
        common = _common_prefix(probes[0], probes[1])
        cut = max((common.rfind(t) + len(t) for t in specials if t and t in common), default=0)
        if cut == 0:
            return None
        head = TemplateHead(common[:cut], self._ids(common[:cut]))
        for text in probes:
            if self._ids(text) != head.ids + self._ids(text[cut:], add_special=False):
                return None
        return head

    def _rendered(self, user_text: str) -> str:
        """The chat template's prompt for one user turn of ``user_text``."""
        turn = [{"role": "user", "content": [{"type": "text", "text": user_text}]}]
        text: str = self.processor.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)
        return text

    def expand_images(self, ids: list[int], request: GenerationRequest) -> tuple[list[int], list[ImageSpan]]:
        tok = self.arch.image_token_id
        found = ids.count(tok)
        if found != len(request.images):
            raise RequestRejected(f"prompt has {found} image placeholders for {len(request.images)} images")
        out: list[int] = []
        spans: list[ImageSpan] = []
        start = 0
        for index, image in enumerate(request.images):  # slices between placeholders: no per-token loop
            at = ids.index(tok, start)
            out += ids[start:at]
            n = self.arch.tokens_per_image(image)
            spans.append(ImageSpan(len(out), len(out) + n, index, image.digest))
            out += [tok] * n
            start = at + 1
        out += ids[start:]
        return out, spans


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def count_image_parts(messages: list[dict[str, Any]]) -> int:
    if not isinstance(messages, list) or not messages:
        raise RequestRejected("messages must be a non-empty list")
    n = 0
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise RequestRejected("each message needs 'role' and 'content'")
        if isinstance(m["content"], list):
            n += sum(1 for part in m["content"] if isinstance(part, dict) and part.get("type") == "image")
    return n


def check_sampling(p: SamplingParams, config: EngineConfig) -> None:
    if not 1 <= p.max_tokens <= config.max_new_tokens_limit:
        raise RequestRejected(f"max_tokens must be in [1, {config.max_new_tokens_limit}], got {p.max_tokens}")
    if not 0 <= p.min_tokens <= p.max_tokens:
        raise RequestRejected(f"min_tokens must be in [0, max_tokens={p.max_tokens}], got {p.min_tokens}")
    if not (math.isfinite(p.temperature) and 0.0 <= p.temperature <= 100.0):
        raise RequestRejected(f"temperature must be in [0, 100], got {p.temperature}")
    if not (math.isfinite(p.top_p) and 0.0 < p.top_p <= 1.0):
        raise RequestRejected(f"top_p must be in (0, 1], got {p.top_p}")
    if p.top_k < 0:
        raise RequestRejected(f"top_k must be >= 0, got {p.top_k}")
    if p.seed is not None and not 0 <= p.seed < 2**63:
        raise RequestRejected(f"seed must be in [0, 2**63), got {p.seed}")
    if len(p.stop) > MAX_STOP_STRINGS or any(not isinstance(s, str) or not s for s in p.stop):
        raise RequestRejected(f"stop must be at most {MAX_STOP_STRINGS} non-empty strings")
