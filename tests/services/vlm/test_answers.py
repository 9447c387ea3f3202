"""The committed model answers fixed questions about the bundled example images exactly."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from tinyvlm import evalsets
from tinyvlm.engine_answers import EngineAnswerer
from tinyvlm.evaluate import run_conversations
from tinyvlm.examples import QUESTIONS
from tinyvlm.questions import Turn

from .conftest import EXAMPLES


def ask(loaded: Callable[[str], tuple[Any, Any]], mode: str) -> list[list[str]]:
    model, processor = loaded(mode)
    convs = [[Turn(q, a, "", i > 0, False) for i, (q, a) in enumerate(conv)] for _, conv in QUESTIONS]
    images = [Image.open(EXAMPLES / name).convert("RGB") for name, _ in QUESTIONS]
    return run_conversations(model, processor, convs, images)


def expected() -> list[list[str]]:
    return [[a for _, a in conv] for _, conv in QUESTIONS]


def test_readme_example_with_plain_generate(
    model_dir: Path, loaded: Callable[[str], tuple[Any, Any]]
) -> None:
    model, processor = loaded("none")
    messages = [
        {
            "role": "user",
            "content": [{"type": "image"}, {"type": "text", "text": "What colour is the circle?"}],
        }
    ]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=[text], images=[Image.open(EXAMPLES / "shapes.png")], return_tensors="pt")
    out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    answer = processor.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert answer.strip() == "red"


def test_fixed_questions_fp32(loaded: Callable[[str], tuple[Any, Any]]) -> None:
    assert ask(loaded, "none") == expected()


@pytest.mark.parametrize("mode", ["bf16", "int8", "int4"])
def test_quantized_modes_load_and_agree_with_fp32(
    loaded: Callable[[str], tuple[Any, Any]], mode: str
) -> None:
    reference = [a for conv in ask(loaded, "none") for a in conv]
    answers = [a for conv in ask(loaded, mode) for a in conv]
    assert all(answers), (mode, answers)  # every question got a non-empty answer
    agree = sum(a == r for a, r in zip(answers, reference, strict=True))
    assert agree >= len(reference) - 1, (mode, answers, reference)


def test_bf16_answers_held_out_questions_like_fp32(loaded: Callable[[str], tuple[Any, Any]]) -> None:
    """Held-out conversations (41 questions, 6 of them counts): bf16 gives fp32's answer to all but
    at most one. Casting the whole model to bf16 differed on about a fifth of them (76.6 vs 95.3 %
    on the first 64, counting 38 vs 100 %)."""
    items = list(evalsets.items(evalsets.HELDOUT, 40))
    images = [evalsets.client_image(item, seed=i) for i, item in enumerate(items)]
    convs = [item.turns for item in items]
    fp32, bf16 = (
        [a for conv in run_conversations(*loaded(mode), convs, images) for a in conv]
        for mode in ("none", "bf16")
    )
    differ = [(i, a, b) for i, (a, b) in enumerate(zip(fp32, bf16, strict=True)) if a != b]
    assert len(differ) <= 1, differ


def test_the_engine_backend_answers_like_generate(loaded: Callable[[str], tuple[Any, Any]]) -> None:
    """``make eval`` answers through the serving engine (caches, continuous batching); on held-out
    conversations (multi-turn, the model's own answers as history) it gives generate's answers."""
    items = list(evalsets.items(evalsets.HELDOUT, 60))
    images = [evalsets.client_image(item, seed=i) for i, item in enumerate(items)]
    convs = [item.turns for item in items]
    reference = run_conversations(*loaded("none"), convs, images)
    answerer = EngineAnswerer(*loaded("none"), max_batch=16)
    try:
        assert answerer.run_conversations(convs, images) == reference
        examples = [[Turn(q, a, "", i > 0, False) for i, (q, a) in enumerate(conv)] for _, conv in QUESTIONS]
        pictures = [Image.open(EXAMPLES / name).convert("RGB") for name, _ in QUESTIONS]
        assert answerer.run_conversations(examples, pictures) == expected()
    finally:
        answerer.close()
