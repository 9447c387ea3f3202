"""Byte-level BPE tokenizer for vlmq-tiny, trained on the task's own words, plus the chat template.

Byte-level means any text encodes (unknown words fall back to bytes); the merges come from a
corpus of every phrasing and answer, so questions are short in tokens. The corpus is fixed and
ordered, so the tokenizer is identical on every run.
"""

from collections.abc import Iterator

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from tinyvlm import templates, vocab

EOS = "<|endoftext|>"
PAD = "<|pad|>"
IMAGE = "<|image|>"
BEGIN_IMAGE = "<|begin_of_image|>"
END_IMAGE = "<|end_of_image|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS: tuple[str, ...] = (
    EOS,
    PAD,
    *ROLE_TOKENS,
    BEGIN_IMAGE,
    END_IMAGE,
    IMAGE,
    "<|begin_of_video|>",
    "<|end_of_video|>",
    "<|video|>",
)
VOCAB_SIZE = 640

# Jinja chat template: inserts the default system prompt when the conversation has none, renders
# {"type": "image"} parts as one image placeholder (the processor expands it to the real count),
# and ends every assistant turn with EOS so generation stops there.
CHAT_TEMPLATE = (
    "{%- set default_system = " + repr(vocab.DEFAULT_SYSTEM_PROMPT).replace("'", '"') + " -%}"
    "{%- if not messages or messages[0]['role'] != 'system' -%}"
    "<|system|>{{ default_system }}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "<|{{ message['role'] }}|>"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}<|begin_of_image|><|image|><|end_of_image|>"
    "{%- elif part['type'] == 'text' -%}{{ part['text'] }}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{%- if message['role'] == 'assistant' -%}<|endoftext|>{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)


def _fill(phrasing: str) -> Iterator[str]:
    """A few filled-in variants of one phrasing, enough for BPE to see every word in context."""
    for colour in vocab.COLOURS:
        for shape in vocab.SHAPES:
            ref = f"the {colour} {shape}"
            yield phrasing.format(ref=ref, other=f"the {shape}", what=templates.plural(shape))
            yield phrasing.format(ref=f"the {colour} shape", other=ref, what=f"{colour} shapes")
    for phrase in templates.CELL_PHRASES.values():
        yield phrasing.format(ref=f"the shape {phrase}", other="the circle", what="shapes")


def corpus() -> Iterator[str]:
    """Every phrasing filled in, every answer, and the system prompt."""
    yield vocab.DEFAULT_SYSTEM_PROMPT
    for table in (templates.PHRASINGS, templates.FOLLOW_UPS):
        for options in table.values():
            for phrasing in options:
                yield from _fill(phrasing)
    answers = [*vocab.SHAPES, *vocab.COLOURS, *vocab.SIZES, *vocab.CELL_NAMES.values(), *vocab.RELATIONS]
    yield from answers * 20
    yield from [str(n) for n in range(vocab.MAX_OBJECTS + 1)] * 20
    yield from list(vocab.GLYPHS) * 20


def train_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    return tok


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The fast tokenizer saved with the checkpoint (chat template attached)."""
    fast = PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(),
        eos_token=EOS,
        pad_token=PAD,
        extra_special_tokens={"image_token": IMAGE},
        padding_side="left",
        model_max_length=2048,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast
