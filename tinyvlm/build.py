"""Build vlmq-tiny's config, tokenizer and processor; ``--random`` saves an untrained checkpoint.

python -m tinyvlm.build --random runs/vlmq-tiny-random
"""

import argparse
from pathlib import Path
from typing import Any

import torch
from transformers import Glm4vConfig, Glm4vForConditionalGeneration, PreTrainedTokenizerFast

from services.vlm.registration import VlmqGlm4vImageProcessor, VlmqGlm4vProcessor
from tinyvlm import tokenizer as tk

# One image token per cell of the pictures' 3x3 grid: every picture is resized to a 168-px square
# (VlmqGlm4vImageProcessor.square_side), cut into 28-px patches, merged 2x2 into 56-px tokens. An
# object then always lies in one token, at its centre give or take its jitter, so the vision tower
# classifies centred objects and the language model looks each object up in one token
# (tinyvlm/README.md has the figures that led here; GLM-4V's own 14-px patches at 64 tokens, objects
# anywhere across tokens, learnt shapes at chance in the budget).
PATCH = 28
MERGE = 2
TOKEN = PATCH * MERGE
GRID = 3  # image tokens per side
SIDE = GRID * TOKEN
# Glm4v's smart_resize counts 2 temporal frames; JPEG draft decoding reads the budget from here.
PIXELS = 2 * SIDE * SIDE
# The language model's width, and so the vision tower's output width. 128, not 256: with the
# referent loss the lookups form in about as many steps, and each step costs 2.5x less.
TEXT_HIDDEN = 128
TEXT_HEADS = 4
TEXT_LAYERS = 4  # 6 learnt slower: 66 % against 73 % after 1,000 steps with perfect image features


def build_image_processor() -> VlmqGlm4vImageProcessor:
    # kwargs go through **kwargs in the stubs, hence the dict.
    options: dict[str, Any] = dict(
        patch_size=PATCH,
        temporal_patch_size=2,
        merge_size=MERGE,
        size={"shortest_edge": PIXELS, "longest_edge": PIXELS},
    )
    return VlmqGlm4vImageProcessor(square_side=SIDE, **options)


def build_processor(tokenizer: PreTrainedTokenizerFast | None = None) -> VlmqGlm4vProcessor:
    tok = tokenizer or tk.build_tokenizer()
    return VlmqGlm4vProcessor(
        image_processor=build_image_processor(), tokenizer=tok, chat_template=tk.CHAT_TEMPLATE
    )


def mrope_section(head_dim: int) -> list[int]:
    """Time, height and width shares of the rotary pairs of half a head (head_dim 32: [2, 3, 3])."""
    pairs = head_dim // 4
    time = pairs // 4
    return [time, (pairs - time) // 2, (pairs - time) // 2]


def build_config(tokenizer: PreTrainedTokenizerFast) -> Glm4vConfig:
    def ids(token: str) -> int:
        value = tokenizer.convert_tokens_to_ids(token)
        assert isinstance(value, int)
        return value

    hidden = TEXT_HIDDEN
    # A dict, not keywords: eos/pad ids are generic config kwargs the typed signature omits.
    options: dict[str, Any] = dict(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=hidden,
            intermediate_size=4 * hidden,
            num_hidden_layers=TEXT_LAYERS,
            num_attention_heads=TEXT_HEADS,
            num_key_value_heads=2,
            max_position_embeddings=2048,
            # Half of each head is rotary; the three M-RoPE sections (time, height, width) share
            # its frequency pairs.
            rope_parameters=dict(
                rope_type="default",
                rope_theta=10000.0,
                partial_rotary_factor=0.5,
                mrope_section=mrope_section(hidden // TEXT_HEADS),
            ),
            pad_token_id=tokenizer.pad_token_id,
        ),
        vision_config=dict(
            depth=4,
            hidden_size=128,
            num_heads=4,
            intermediate_size=512,
            patch_size=PATCH,
            out_hidden_size=hidden,
            image_size=SIDE,
            spatial_merge_size=MERGE,
            temporal_patch_size=2,
        ),
        image_token_id=ids(tk.IMAGE),
        video_token_id=ids("<|video|>"),
        image_start_token_id=ids(tk.BEGIN_IMAGE),
        image_end_token_id=ids(tk.END_IMAGE),
        video_start_token_id=ids("<|begin_of_video|>"),
        video_end_token_id=ids("<|end_of_video|>"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    return Glm4vConfig(**options)


def build_model(tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> Glm4vForConditionalGeneration:
    torch.manual_seed(seed)
    model = Glm4vForConditionalGeneration(build_config(tokenizer))
    # The patch features are RMS-normalised to ~1 per dimension before the learned position
    # embedding is added; at the default std 0.02 where a token sits is drowned out, and the
    # "where is it" answers have nothing to read.
    torch.nn.init.normal_(model.model.visual.embeddings.position_embedding.weight, std=1.0)
    gen = model.generation_config
    gen.eos_token_id = tokenizer.eos_token_id
    gen.pad_token_id = tokenizer.pad_token_id
    gen.do_sample = False
    gen.max_new_tokens = 8
    return model


def save_checkpoint(model: Glm4vForConditionalGeneration, processor: VlmqGlm4vProcessor, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    processor.save_pretrained(out)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--random", action="store_true", help="save untrained weights (required for now)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not args.random:
        parser.error("only --random is supported; trained checkpoints come from `python -m tinyvlm.train`")
    processor = build_processor()
    model = build_model(processor.tokenizer, seed=args.seed)
    save_checkpoint(model, processor, args.out)
    n = sum(p.numel() for p in model.parameters())
    print(f"saved random vlmq-tiny ({n / 1e6:.2f}M parameters) to {args.out}")


if __name__ == "__main__":
    main()
