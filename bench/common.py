"""Helpers shared by the engine benchmark and the engine tests: tiny random VLMs of several
architectures (with a tokenizer and chat template built on the fly), procedurally drawn images and
the bundled-model path. Nothing here is mocked: these are real transformers models with random
weights, small enough for CPU."""

from __future__ import annotations

import hashlib
import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image, ImageDraw
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from services.engine.api import ImageInput

ROOT = Path(__file__).resolve().parents[1]
BUNDLED_MODEL = ROOT / "models" / "vlmq-tiny"
SYSTEM_PROMPT = (
    "You are a tiny test assistant. You look at one picture of simple shapes drawn on a plain "
    "background and answer questions about it with one or two words or a number. Shapes can be a "
    "circle, square, triangle, star, diamond or cross, in eight colours, small or big, placed on a "
    "three by three grid. If the user asks a follow-up question, it is about the same object."
)
_CORPUS = [
    SYSTEM_PROMPT,
    "What shape is the red circle? Where is it? How many shapes are there? What colour is it?",
    "red green blue yellow orange purple pink cyan small big left right above below top bottom centre",
    "0 1 2 3 4 5 6 7 8 9 A B E H K M R T X Z",
]


@dataclass(frozen=True)
class Family:
    """Chat format of one architecture family: special tokens and a Jinja chat template."""

    name: str
    eos: str
    pad: str
    image: str
    specials: tuple[str, ...]
    template: str


def _sys(tag_open: str, tag_close: str) -> str:
    return (
        "{%- if not messages or messages[0]['role'] != 'system' -%}"
        + tag_open.replace("ROLE", "system")
        + SYSTEM_PROMPT
        + tag_close
        + "{%- endif -%}"
    )


_PARTS = (
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}IMG{%- elif part['type'] == 'text' -%}{{ part['text'] }}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
)

GLM = Family(
    "glm4v",
    "<|endoftext|>",
    "<|pad|>",
    "<|image|>",
    (
        "<|endoftext|>",
        "<|pad|>",
        "<|system|>",
        "<|user|>",
        "<|assistant|>",
        "<|begin_of_image|>",
        "<|end_of_image|>",
        "<|image|>",
        "<|begin_of_video|>",
        "<|end_of_video|>",
        "<|video|>",
    ),
    _sys("<|ROLE|>", "")
    + "{%- for message in messages -%}<|{{ message['role'] }}|>"
    + _PARTS.replace("IMG", "<|begin_of_image|><|image|><|end_of_image|>")
    + "{%- if message['role'] == 'assistant' -%}<|endoftext|>{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}",
)
QWEN = Family(
    "qwen2_vl",
    "<|im_end|>",
    "<|endoftext|>",
    "<|image_pad|>",
    (
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<|vision_start|>",
        "<|vision_end|>",
        "<|image_pad|>",
        "<|video_pad|>",
    ),
    _sys("<|im_start|>ROLE\n", "<|im_end|>\n")
    + "{%- for message in messages -%}<|im_start|>{{ message['role'] }}\n"
    + _PARTS.replace("IMG", "<|vision_start|><|image_pad|><|vision_end|>")
    + "<|im_end|>\n{%- endfor -%}{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}",
)
LLAVA = Family(
    "llava",
    "</s>",
    "<pad>",
    "<image>",
    ("</s>", "<pad>", "<image>"),
    _sys("SYSTEM: ", "\n")
    + "{%- for message in messages -%}{{ message['role'] | upper }}: "
    + _PARTS.replace("IMG", "<image>\n")
    + "{%- if message['role'] == 'assistant' -%}</s>{%- endif -%}\n{%- endfor -%}"
    "{%- if add_generation_prompt -%}ASSISTANT:{%- endif -%}",
)
FAMILIES = {f.name: f for f in (GLM, QWEN, LLAVA)}


def build_tokenizer(family: Family, vocab_size: int = 400) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on a fixed corpus (deterministic), with the family's template."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(family.specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=family.eos, pad_token=family.pad, padding_side="left"
    )
    fast.chat_template = family.template
    return fast


def _text_config(vocab: int, pad: int, hidden: int, layers: int, heads: int, rotary: float) -> dict[str, Any]:
    cfg: dict[str, Any] = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=4096,
        pad_token_id=pad,
    )
    if rotary:  # M-RoPE: the section sizes split half the rotary dims into (t, h, w)
        half = int(hidden // heads * rotary) // 2
        cfg["rope_parameters"] = dict(
            rope_type="default",
            rope_theta=10000.0,
            partial_rotary_factor=rotary,
            mrope_section=_mrope_section(half),
        )
    return cfg


def _mrope_section(half_rot: int) -> list[int]:
    t = half_rot // 4 or 1
    return [t, (half_rot - t) // 2, half_rot - t - (half_rot - t) // 2]


def build_model(family_name: str, size: str = "tiny", seed: int = 0) -> tuple[Any, Any]:
    """A random-weight model of ``family_name`` and a processor-like object (tokenizer + image processor)."""
    fam = FAMILIES[family_name]
    tok = build_tokenizer(fam)
    ids: dict[str, int] = {t: tok.convert_tokens_to_ids(t) for t in fam.specials}  # type: ignore[misc]
    hidden, layers, heads = (128, 4, 4) if size == "tiny" else (512, 12, 8)
    torch.manual_seed(seed)
    if fam.name == "llava":
        model, ip = _llava(tok, ids, hidden, layers, heads)
    else:
        model, ip = _mrope_model(fam, tok, ids, hidden, layers, heads)
    model.generation_config.eos_token_id = tok.convert_tokens_to_ids(fam.eos)
    model.generation_config.pad_token_id = tok.pad_token_id
    return model.eval(), TinyProcessor(tok, ip)


def _mrope_model(fam: Family, tok: Any, ids: dict[str, int], hidden: int, layers: int, heads: int) -> Any:
    vision = dict(
        depth=2,
        hidden_size=96,
        num_heads=4,
        intermediate_size=256,
        patch_size=8,
        out_hidden_size=hidden,
        image_size=64,
        spatial_merge_size=2,
        temporal_patch_size=2,
    )
    text = _text_config(
        len(tok), tok.pad_token_id, hidden, layers, heads, 0.5 if fam.name == "glm4v" else 1.0
    )
    text["eos_token_id"] = text["bos_token_id"] = tok.convert_tokens_to_ids(fam.eos)
    if fam.name == "glm4v":
        from transformers import Glm4vConfig, Glm4vForConditionalGeneration
        from transformers.models.glm4v.image_processing_pil_glm4v import Glm4vImageProcessorPil

        cfg = Glm4vConfig(
            text_config=text,
            vision_config=vision,
            image_token_id=ids["<|image|>"],
            video_token_id=ids["<|video|>"],
            image_start_token_id=ids["<|begin_of_image|>"],
            image_end_token_id=ids["<|end_of_image|>"],
            video_start_token_id=ids["<|begin_of_video|>"],
            video_end_token_id=ids["<|end_of_video|>"],
        )
        ip: Any = Glm4vImageProcessorPil(  # type: ignore[call-arg]
            patch_size=8,
            temporal_patch_size=2,
            merge_size=2,
            size={"shortest_edge": 32 * 32, "longest_edge": 128 * 128},
        )
        return Glm4vForConditionalGeneration(cfg), ip
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    qv = dict(
        depth=2,
        embed_dim=96,
        hidden_size=hidden,
        num_heads=4,
        mlp_ratio=2,
        patch_size=8,
        spatial_merge_size=2,
        temporal_patch_size=2,
    )
    qcfg = Qwen2VLConfig(
        text_config=text,
        vision_config=qv,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    qip = Qwen2VLImageProcessorPil(
        patch_size=8, temporal_patch_size=2, merge_size=2, min_pixels=32 * 32, max_pixels=128 * 128
    )
    return Qwen2VLForConditionalGeneration(qcfg), qip


def _llava(tok: Any, ids: dict[str, int], hidden: int, layers: int, heads: int) -> Any:
    from transformers import LlavaConfig, LlavaForConditionalGeneration
    from transformers.models.llava.image_processing_pil_llava import LlavaImageProcessorPil

    vision = dict(
        model_type="clip_vision_model",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=32,
        patch_size=8,
        projection_dim=64,
    )
    text = dict(model_type="llama", **_text_config(len(tok), tok.pad_token_id, hidden, layers, heads, 0.0))
    cfg = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=ids["<image>"],
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
    )
    ip = LlavaImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    return LlavaForConditionalGeneration(cfg), ip


class TinyProcessor:
    """The part of a HF processor the engine uses: ``tokenizer``, ``image_processor``, chat template."""

    def __init__(self, tokenizer: Any, image_processor: Any) -> None:
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.chat_template = tokenizer.chat_template

    def apply_chat_template(self, messages: list[dict[str, Any]], **kw: Any) -> Any:
        return self.tokenizer.apply_chat_template(messages, **kw)


def draw_image(seed: int, size: tuple[int, int] = (64, 64)) -> bytes:
    """A PNG of a few coloured shapes, deterministic in ``seed``."""
    g = torch.Generator().manual_seed(seed)
    img = Image.new("RGB", size, (240, 240, 240))
    d = ImageDraw.Draw(img)
    for _ in range(3):
        x, y = (int(v) for v in torch.randint(0, min(size) - 12, (2,), generator=g))
        col = tuple(int(v) for v in torch.randint(0, 255, (3,), generator=g))
        d.ellipse((x, y, x + 12, y + 12), fill=col)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def image_input(processor: Any, png: bytes) -> ImageInput:
    """What the decode worker hands the engine: image-processor tensors + the full sha256 digest."""
    img = Image.open(io.BytesIO(png)).convert("RGB")
    out = processor.image_processor(images=[img], return_tensors="pt")
    grid = out.get("image_grid_thw")
    extra = {k: v for k, v in out.items() if k not in ("pixel_values", "image_grid_thw")}
    pv = out["pixel_values"]
    return ImageInput(
        pixel_values=pv,
        image_grid_thw=grid if grid is not None else torch.zeros(0),
        digest=hashlib.sha256(png).hexdigest(),
        extra=extra,
    )


def bundled_model_path() -> Path:
    """``VLMQ_ENGINE_MODEL`` if set (e.g. a random-init checkpoint), else the committed models/vlmq-tiny."""
    override = os.environ.get("VLMQ_ENGINE_MODEL")
    return Path(override) if override else BUNDLED_MODEL


def bundled_is_random() -> bool:
    """Random weights give near-tied logits: exactness tests then allow divergence at near ties."""
    return "random" in bundled_model_path().name


def load_bundled(quantize: str = "none") -> tuple[Any, Any]:
    from services.vlm.loading import load_model

    return load_model(bundled_model_path(), quantize, "cpu")


def build_large_glm(processor: Any, seed: int = 0, small: bool = False) -> Any:
    """A ~91M-parameter random Glm4v with the bundled model's tokenizer/processor geometry, where
    compute (not Python overhead) dominates: 8 text layers of width 768, a 12-block vision tower.
    ``small``: the same shapes per head (head dim 64) at 2 layers of width 256 (smoke runs)."""
    from transformers import Glm4vConfig, Glm4vForConditionalGeneration

    cfg = Glm4vConfig.from_pretrained(bundled_model_path())
    tc: Any = cfg.text_config
    vc: Any = cfg.vision_config
    width, layers, heads = (256, 2, 4) if small else (768, 8, 12)
    tc.hidden_size, tc.intermediate_size, tc.num_hidden_layers = width, 3 * width, layers
    tc.num_attention_heads, tc.num_key_value_heads = heads, 4 if heads % 4 == 0 else heads
    vc.hidden_size, vc.intermediate_size = (128, 384) if small else (512, 1536)
    vc.depth, vc.num_heads = (2, 4) if small else (12, 8)
    vc.out_hidden_size = width
    fit_mrope_sections(tc)
    torch.manual_seed(seed)
    model = Glm4vForConditionalGeneration(cfg).eval()
    model.generation_config.eos_token_id = processor.tokenizer.eos_token_id
    model.generation_config.pad_token_id = processor.tokenizer.pad_token_id
    return model


def fit_mrope_sections(text_config: Any) -> None:
    """Derive M-RoPE's (t, h, w) sections from the config's own head dim: the sections must split
    half its rotary dims exactly (copied from another config they break the forward)."""
    rope = dict(getattr(text_config, "rope_parameters", None) or {})
    if "mrope_section" not in rope:
        return
    head_dim = (
        getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads
    )
    half = int(head_dim * rope.get("partial_rotary_factor", 1.0)) // 2
    rope["mrope_section"] = _mrope_section(half)
    text_config.rope_parameters = rope
