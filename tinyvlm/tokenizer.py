"""Byte-level BPE tokenizer for vlmq-tiny, trained on the task's own words, plus the chat template.

Byte-level means any text encodes (unknown words fall back to bytes); the merges come from a
corpus of every phrasing and answer, so questions are short in tokens. The corpus is fixed and
ordered, so the tokenizer is identical on every run.
"""

import json
from collections.abc import Iterator

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from tinyvlm import grammar, templates, vocab
from tinyvlm import phrasebook as pb

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
VOCAB_SIZE = 1024

# Jinja chat template: inserts the default system prompt when the conversation has none, renders
# {"type": "image"} parts as one image placeholder (the processor expands it to the real count),
# and ends every assistant turn with EOS so generation stops there. A message's pictures come
# before its text whatever the parts' order: the model only ever saw the picture first, and many
# clients send [question, picture] (OpenAI's own examples do; eval row surface/text_first).
CHAT_TEMPLATE = (
    "{%- set default_system = " + json.dumps(vocab.DEFAULT_SYSTEM_PROMPT) + " -%}"
    "{%- if not messages or messages[0]['role'] != 'system' -%}"
    "<|system|>{{ default_system }}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "<|{{ message['role'] }}|>"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}"
    "{%- for part in message['content'] if part['type'] == 'image' -%}"
    "<|begin_of_image|><|image|><|end_of_image|>"
    "{%- endfor -%}"
    "{%- for part in message['content'] if part['type'] == 'text' -%}{{ part['text'] }}{%- endfor -%}"
    "{%- endif -%}"
    "{%- if message['role'] == 'assistant' -%}<|endoftext|>{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)


def _fill(phrasing: str) -> Iterator[str]:
    """A few filled-in variants of one phrasing, enough for BPE to see every word in context."""
    for colour in vocab.COLOURS:
        for shape in vocab.SHAPES:
            ref = f"the {colour} {shape}"
            yield phrasing.format(
                ref=ref, other=f"the {shape}", what=templates.plural(shape), obj=f"a {shape}"
            )
            yield phrasing.format(
                ref=f"the {colour} shape", other=ref, what=f"{colour} shapes", obj=f"a {colour} shape"
            )
    for phrase in templates.CELL_PHRASES.values():
        yield phrasing.format(ref=f"the shape {phrase}", other="the circle", what="shapes", obj="a shape")


def _words() -> Iterator[str]:
    """The training grammar's words (never its held-out families): references, fillers, noise."""
    for kind in pb.CORES:
        for template in grammar.training_templates(kind):
            text = template.format(
                ref="the red circle", other="the blue star", what="red shapes", obj="a star"
            )
            yield text
            yield text.upper()
    for phrases in pb.CELL_PHRASES.values():
        yield from (f"the shape {p}" for p in phrases)
    for words in pb.NEIGHBOUR_WORDS.values():
        yield from (f"the object {w} the circle" for w in words)
    yield from pb.SHAPE_NOUNS + pb.PLURAL_SHAPE_NOUNS + pb.PRONOUNS + pb.SYSTEM_PROMPTS
    yield from (
        s.replace("{noun}", n) for s in pb.SHORT_FOLLOW_UPS for ns in pb.ATTRIBUTE_NOUNS.values() for n in ns
    )
    yield from (q.format(ref="the star") for q in pb.UNKNOWN_QUESTIONS[0])
    yield from pb.UNKNOWN_THINGS[0] + pb.UNKNOWN_PLURALS[0] + pb.JSON_INSTRUCTIONS
    yield from (f'{{"{key}":"red"}}' for keys in pb.JSON_KEYS.values() for key in keys)
    yield from [pb.CANNOT_TELL, "yes", "no", "please", ", please", "Please, "] * 10


def corpus() -> Iterator[str]:
    """Every phrasing filled in, every answer, and the system prompt."""
    yield vocab.DEFAULT_SYSTEM_PROMPT
    for table in (templates.PHRASINGS, templates.FOLLOW_UPS):
        for options in table.values():
            for phrasing in options:
                yield from _fill(phrasing)
    yield from _words()
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
