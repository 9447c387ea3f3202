"""The chat template's fixed opening tokenized once (``PromptBuilder.head``): every conversation
tokenizes to the same ids as a whole-prompt tokenization, for the bundled model and the tiny
random families (whose templates and tokenizers differ)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from services.engine.architectures import Architecture
from services.engine.config import EngineConfig
from services.engine.prompt import PromptBuilder

WORDS = ["red", "What", "colour", "is", "the", "shape", "?", "  ", "Hi", "\n", "é", "big ", "3", "<|user|>x"]


def conversations(count: int, seed: int) -> list[list[dict[str, Any]]]:
    """One to three user turns (with or without a picture), some answered, some after a system turn."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        turns: list[dict[str, Any]] = []
        for k in range(rng.randint(1, 3)):
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 8)))
            image = [{"type": "image"}] if rng.random() < 0.7 else []
            turns.append({"role": "user", "content": [*image, {"type": "text", "text": text}]})
            if k < 2 and rng.random() < 0.5:
                turns.append({"role": "assistant", "content": [{"type": "text", "text": rng.choice(WORDS)}]})
        if turns[-1]["role"] != "user":
            turns.append({"role": "user", "content": [{"type": "text", "text": "ok"}]})
        if rng.random() < 0.2:
            turns.insert(0, {"role": "system", "content": [{"type": "text", "text": "Be brief."}]})
        out.append(turns)
    return out


@pytest.mark.parametrize("name", ["bundled", "glm4v", "qwen2_vl", "llava"])
def test_the_head_tokenizes_like_the_whole_prompt(name: str, bundled: Any, tiny_models: Any) -> None:
    model, processor = bundled if name == "bundled" else tiny_models[name]
    builder = PromptBuilder(Architecture(model, processor), processor, EngineConfig())
    if name == "bundled":  # its template opens with the default system prompt: the head is used
        assert builder.head is not None and builder.head.text.endswith("<|user|>")
    head, used = builder.head, 0
    for turns in conversations(150, seed=len(name)):
        fast = builder.tokenize(turns)
        used += head is not None and builder.processor.apply_chat_template(
            turns, tokenize=False, add_generation_prompt=True
        ).startswith(head.text)
        builder.head = None
        assert fast == builder.tokenize(turns), (name, turns)
        builder.head = head
    assert head is None or used > 50, name
