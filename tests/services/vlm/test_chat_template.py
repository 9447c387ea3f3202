"""Chat template and processor: default system prompt, image expansion, several turns."""

from pathlib import Path

from PIL import Image
from transformers import AutoProcessor

from services.vlm.registration import VlmqGlm4vProcessor
from tinyvlm.vocab import DEFAULT_SYSTEM_PROMPT

TURNS = [
    {
        "role": "user",
        "content": [{"type": "image"}, {"type": "text", "text": "What shape is the red shape?"}],
    },
    {"role": "assistant", "content": "circle"},
    {"role": "user", "content": "And its colour?"},
]


def test_auto_processor_resolves_image_only_class(model_dir: Path) -> None:
    processor = AutoProcessor.from_pretrained(model_dir)
    assert isinstance(processor, VlmqGlm4vProcessor)
    assert type(processor.image_processor).__name__ == "VlmqGlm4vImageProcessor"


def test_default_system_prompt_inserted_and_turns_rendered(model_dir: Path) -> None:
    processor = AutoProcessor.from_pretrained(model_dir)
    text = processor.apply_chat_template(TURNS, add_generation_prompt=True, tokenize=False)
    assert text == (
        f"<|system|>{DEFAULT_SYSTEM_PROMPT}<|user|><|begin_of_image|><|image|><|end_of_image|>"
        "What shape is the red shape?<|assistant|>circle<|endoftext|><|user|>And its colour?<|assistant|>"
    )
    system_tokens = processor.tokenizer(DEFAULT_SYSTEM_PROMPT)["input_ids"]
    assert 90 <= len(system_tokens) <= 160  # one shared prefix the prefix cache skips (145 tokens)


def test_explicit_system_message_replaces_default(model_dir: Path) -> None:
    processor = AutoProcessor.from_pretrained(model_dir)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<|system|>Be brief.<|user|>Hi<|assistant|>"


def test_image_placeholder_expands_to_one_token_per_grid_cell(model_dir: Path) -> None:
    processor = AutoProcessor.from_pretrained(model_dir)
    text = processor.apply_chat_template(TURNS, add_generation_prompt=True, tokenize=False)
    patch = processor.image_processor.patch_size
    for size in [(300, 200), (1024, 1024), (96, 190), (2000, 1500)]:
        inputs = processor(text=[text], images=[Image.new("RGB", size, "white")], return_tensors="pt")
        assert inputs["image_grid_thw"][0].tolist() == [1, 6, 6]  # any size is resized, never rejected
        n_image = int((inputs["input_ids"][0] == processor.image_token_id).sum())
        assert n_image == 9  # 6x6 patches merged 2x2: one token per cell of the pictures' 3x3 grid
        assert inputs["pixel_values"].shape == (36, 3 * 2 * patch * patch)
