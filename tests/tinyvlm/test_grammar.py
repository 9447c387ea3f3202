"""The paraphrase grammar and people's-words conversations: held-out families never reach training
(nor the tokenizer), every new answer matches its picture, noise keeps references findable."""

import json
import random

from tinyvlm import dialogue, grammar, tokenizer, vocab
from tinyvlm import phrasebook as pb
from tinyvlm.data import training_conversation, training_system_prompt
from tinyvlm.grammar import Split
from tinyvlm.scene import TRAIN_SPEC, sample_scene

HELD_OUT_MARKERS = (
    "Quick question:",
    ", do you know?",
    "Give me ",
    "Could you name",
    "Do you know",
    "I wonder",
)


def _training_turns(count: int = 300) -> list:
    return [turn for i in range(count) for turn in training_conversation(77, i)[1]]


def test_training_never_asks_through_a_held_out_family() -> None:
    turns = _training_turns()
    assert not any(turn.held_out_phrasing for turn in turns)
    for turn in turns:
        lowered = turn.question.lower()
        assert not any(marker.lower() in lowered for marker in HELD_OUT_MARKERS), turn.question
        assert not any(thing in lowered for thing in pb.UNKNOWN_THINGS[1]), turn.question
        assert "the same shape" not in lowered


def test_held_out_style_asks_only_through_held_out_families() -> None:
    rng = random.Random(3)
    families = set()
    for _ in range(300):
        for turn in dialogue.conversation(sample_scene(rng, TRAIN_SPEC), rng, dialogue.HELD_OUT_FAMILIES):
            assert turn.held_out_phrasing and turn.family != "seen"
            families.add(turn.family)
    assert len(families) >= 15  # many families, not one


def test_the_tokenizer_corpus_holds_no_held_out_frame() -> None:
    text = "\n".join(tokenizer.corpus()).lower()
    assert not any(marker.lower() in text for marker in HELD_OUT_MARKERS)
    assert "wonder" not in text and "the pentagon" not in text


def test_training_covers_how_people_ask() -> None:
    turns = _training_turns()
    questions = [t.question for t in turns]
    assert sum(q.isupper() for q in questions) > 20  # capitals
    assert sum(q.endswith(" ") for q in questions) > 20  # trailing spaces
    assert sum("please" in q.lower() for q in questions) > 50
    assert sum(q[:1].islower() for q in questions) > 50
    kinds = {t.qtype for t in turns}
    assert {"presence", "unknown", "count", "relative", "text"} <= kinds
    assert sum(t.json for t in turns) > 40
    assert sum(" object" in q or " thing" in q or " item" in q for q in questions) > 100
    assert any("corner" in q for q in questions)
    systems = {training_system_prompt(77, i, TRAIN_SPEC) for i in range(200)}
    assert None in systems and vocab.DEFAULT_SYSTEM_PROMPT in systems and len(systems) >= 5


def test_new_answers_match_the_picture() -> None:
    rng = random.Random(8)
    for _ in range(300):
        scene = sample_scene(rng, TRAIN_SPEC)
        presence = dialogue.ask_presence(scene, rng, Split.TRAIN)
        assert presence.answer == ("yes" if presence.counted else "no")
        assert all(o in scene.objects for o in presence.counted)
        unknown = dialogue.ask_unknown(scene, rng, Split.HELD_OUT)
        assert unknown.answer == pb.CANNOT_TELL
        count = dialogue.as_json(dialogue.ask_count(scene, rng, Split.TRAIN), rng)
        assert list(json.loads(count.answer).values()) == [len(count.counted)]


def test_noise_keeps_every_reference_findable() -> None:
    for i in range(300):
        for turn in training_conversation(5, i)[1]:
            for mention in turn.mentions:
                assert mention.text in turn.question.lower() or "  " in turn.question


def test_phrasings_split_cleanly() -> None:
    rng = random.Random(0)
    for kind in pb.CORES:
        seen = {grammar.phrasing(kind, rng, Split.TRAIN).template for _ in range(200)}
        held = {grammar.phrasing(kind, rng, Split.HELD_OUT).template for _ in range(200)}
        assert seen and held and not seen & held
        assert len(grammar.training_templates(kind)) >= 24  # dozens per type
