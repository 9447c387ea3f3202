"""The paraphrase grammar: a question of a type, phrased by a frame around a core
(``tinyvlm.phrasebook``), from the training families or the held-out ones, plus the surface noise
people type (case, spaces, punctuation, "please").

``Split.TRAIN`` draws only families training may see; ``Split.HELD_OUT`` draws a question with at
least one held-out family in it (a frame, a core or a pronoun that training never sees).
"""

import random
import re
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache

from tinyvlm import phrasebook as pb
from tinyvlm import templates


class Split(StrEnum):
    TRAIN = "train"
    HELD_OUT = "held_out"


@dataclass(frozen=True)
class Phrasing:
    template: str  # placeholders still in it: {ref}, {other}, {what}, {obj}
    family: str  # the held-out frame or core it uses, or "seen"
    held_out: bool


def _pairs(kind: str) -> list[tuple[str, str, str]]:
    """(frame, core, template) for every frame around every core of ``kind``."""
    out = []
    for form, cores in pb.CORES[kind].items():
        for frame in pb.FRAMES[form]:
            for core in cores:
                out.append((frame, core, frame.replace("{" + form + "}", core)))
    if kind == "count":
        out += [("{I}", core, core) for core in pb.COUNT_IMPERATIVES]
    legacy_kind = kind if kind in templates.PHRASINGS else None
    if legacy_kind is not None:  # the first bundled model's phrasings (all but its held-out last one)
        out += [("{L}", phrasing, phrasing) for phrasing in templates.PHRASINGS[legacy_kind][:-1]]
    return out


_PAIRS = {kind: _pairs(kind) for kind in pb.CORES}


def _held(frame: str, core: str) -> str | None:
    if frame in pb.HELD_OUT_FRAMES:
        return frame
    return core if core in pb.HELD_OUT_CORES else None


def training_templates(kind: str) -> list[str]:
    """Every template of ``kind`` training may see."""
    return [t for f, c, t in _PAIRS[kind] if _held(f, c) is None]


def phrasing(kind: str, rng: random.Random, split: Split) -> Phrasing:
    """A template for a question of ``kind`` (a key of ``phrasebook.CORES``)."""
    options = [
        (f, c, t) for f, c, t in _PAIRS[kind] if (_held(f, c) is not None) == (split is Split.HELD_OUT)
    ]
    frame, core, template = rng.choice(options)
    family = _held(frame, core)
    return Phrasing(template, family or "seen", family is not None)


def follow_up(attribute: str, rng: random.Random, split: Split) -> Phrasing:
    """A question about the previous turn's object: a core with a pronoun, or "And its colour?"."""
    if split is Split.HELD_OUT and rng.random() < 0.3:
        pronoun = rng.choice(pb.HELD_OUT_PRONOUNS)
        base = phrasing(attribute, rng, Split.TRAIN)
        return Phrasing(base.template.replace("{ref}", pronoun), pronoun, True)
    if split is Split.TRAIN and rng.random() < 0.3:
        short = rng.choice((*pb.SHORT_FOLLOW_UPS, *templates.FOLLOW_UPS[attribute][:-1]))
        return Phrasing(short.replace("{noun}", rng.choice(pb.ATTRIBUTE_NOUNS[attribute])), "seen", False)
    base = phrasing(attribute, rng, split)
    return Phrasing(base.template.replace("{ref}", rng.choice(pb.PRONOUNS)), base.family, base.held_out)


def fill(template: str, **slots: str) -> str:
    text = template.format(**slots)
    return text[0].upper() + text[1:]


def shape_noun(rng: random.Random) -> str:
    return rng.choice(pb.SHAPE_NOUNS)


def shapes_noun(rng: random.Random) -> str:
    return rng.choice(pb.PLURAL_SHAPE_NOUNS)


def cell_phrase(cell_name: str, rng: random.Random) -> str:
    return rng.choice(pb.CELL_PHRASES[cell_name])


def unknown_question(rng: random.Random, split: Split, ref: str) -> tuple[str, str]:
    """A question outside the model's world, and its family; ``ref`` names an object of the picture
    for the questions that ask something unknowable about one ("How old is the star?")."""
    held = int(split is Split.HELD_OUT)
    roll = rng.random()
    if roll < 0.4:
        thing = rng.choice(pb.UNKNOWN_THINGS[held])
        kind = rng.choice(("colour", "shape", "size", "position"))
        base = phrasing(kind, rng, Split.TRAIN)
        return fill(base.template, ref=thing), f"unknown/{thing}"
    if roll < 0.55:
        plural = rng.choice(pb.UNKNOWN_PLURALS[held])
        base = phrasing("count", rng, Split.TRAIN)
        return fill(base.template, what=plural), f"unknown/{plural}"
    template = rng.choice(pb.UNKNOWN_QUESTIONS[held])
    return fill(template, ref=ref), "unknown/" + template


_VOWELS, _CONSONANTS = "aeiou", "bcdfghjklmnprstvwz"


def made_up_word(rng: random.Random) -> str:
    """A pronounceable word of 3 to 8 letters that names nothing the model knows and holds no
    held-out topic word (``phrasebook.HELD_OUT_WORDS``)."""
    while True:
        letters = []
        vowel = rng.random() < 0.3
        for _ in range(rng.randint(3, 8)):
            letters.append(rng.choice(_VOWELS if vowel else _CONSONANTS))
            vowel = not vowel if rng.random() < 0.85 else vowel
        word = "".join(letters)
        held_out = pb.HELD_OUT_WORDS + pb.HELD_OUT_FRAME_WORDS
        if word not in _known_words() and not any(held in word for held in held_out):
            return word


@lru_cache(maxsize=1)
def _known_words() -> frozenset[str]:
    """Every word of the tokenizer's corpus (the grammar's words): a made-up word is none of them."""
    from tinyvlm import tokenizer  # imports this module

    return frozenset(w for text in tokenizer.corpus() for w in re.findall(r"[a-z]+", text.lower()))


def with_filler(text: str, rng: random.Random) -> str:
    """The question with a stray word that means nothing here ("Zobat, what colour is it?", "What
    colour is it, kettle?"): answered as without it, so unknown pieces outside a reference do not
    make a question unknown (only the referent or the attribute asked does)."""
    word = made_up_word(rng) if rng.random() < 0.7 else rng.choice(pb.UNKNOWN_NOUNS)
    if rng.random() < 0.6:
        return f"{word.capitalize()}{rng.choice((', ', ': ', ' - '))}{text[0].lower()}{text[1:]}"
    mark = text[-1] if text[-1] in "?." else ""
    return f"{text[: len(text) - len(mark)]}, {word}{mark}"


def plural(noun: str) -> str:
    if noun.endswith(("s", "sh", "ch", "x")):
        return noun + "es"
    if noun.endswith("y") and noun[-2:-1] not in _VOWELS:
        return noun[:-1] + "ies"
    return noun + "s"


_SHAPE_WORDS = frozenset(pb.SHAPE_NOUNS + pb.PLURAL_SHAPE_NOUNS)  # words that name a shape


def unknown_thing(rng: random.Random) -> str:
    """An everyday noun or a made-up word: no shape, colour or cell of the model's world."""
    while True:
        word = rng.choice(pb.UNKNOWN_NOUNS) if rng.random() < 0.6 else made_up_word(rng)
        if word not in _SHAPE_WORDS:
            return word


def compositional_unknown(rng: random.Random, ref: str) -> tuple[str, str]:
    """Training's unknown questions: the fixed lists of ``unknown_question``, plus unknown nouns and
    made-up words in any frame and unknowable attributes of anything (``phrasebook.UNKNOWN_NOUNS``)."""
    roll = rng.random()
    if roll < 0.35:
        return unknown_question(rng, Split.TRAIN, ref)
    thing = unknown_thing(rng)
    if roll < 0.6:
        kind = rng.choice(("colour", "shape", "size", "position"))
        return fill(phrasing(kind, rng, Split.TRAIN).template, ref=f"the {thing}"), "unknown/noun"
    if roll < 0.72:
        return fill(phrasing("count", rng, Split.TRAIN).template, what=plural(thing)), "unknown/plural"
    about = ref if rng.random() < 0.5 else f"the {thing}"
    if roll < 0.88:
        attr = rng.choice(pb.UNKNOWN_ATTRIBUTES) if rng.random() < 0.7 else made_up_word(rng)
        return fill(rng.choice(pb.UNKNOWN_ATTRIBUTE_TEMPLATES), attr=attr, ref=about), "unknown/attribute"
    return fill(rng.choice(pb.UNKNOWN_WHOLE), ref=about), "unknown/whole"


def json_answer(qtype: str, answer: str, rng: random.Random) -> tuple[str, str]:
    """An instruction to append to a question, and the answer as compact JSON (the grammar-constrained
    decoder's separators: no spaces)."""
    key = rng.choice(pb.JSON_KEYS[qtype])
    value = answer if qtype == "count" else f'"{answer}"'
    return rng.choice(pb.JSON_INSTRUCTIONS), f'{{"{key}":{value}}}'


def noisy(text: str, rng: random.Random) -> str:
    """Surface noise as people type: case, a missing or doubled mark, stray spaces, "please"."""
    roll = rng.random()
    if roll < 0.08:
        text = text.lower()
    elif roll < 0.13:
        text = text.upper()
    elif roll < 0.2:
        text = text[0].lower() + text[1:]
    mark = text[-1] if text[-1] in "?." else ""
    body = text[: len(text) - len(mark)]
    roll = rng.random()
    if roll < 0.08:
        text = body  # no mark
    elif roll < 0.12:
        text = body + mark * 2
    elif roll < 0.16:
        text = body + " " + mark
    elif roll < 0.24:
        text = body + rng.choice((", please", " please", " pls")) + mark
    elif roll < 0.27:
        text = "Please, " + body[0].lower() + body[1:] + mark
    roll = rng.random()
    if roll < 0.07:
        text = text + " "
    elif roll < 0.1:
        text = " " + text
    elif roll < 0.13:
        text = text + "  "
    return text
