"""Evaluation sets: seeded scenes and conversations, images drawn full size and sent as files.

The eval goes through the real client path: full-size PNG/JPEG bytes, decoded by Pillow, then
the processor resizes them. Phrasings held out of training appear here.
"""

import io
import random
from collections.abc import Iterator
from dataclasses import dataclass

from PIL import Image

from tinyvlm import questions, render, second_renderer
from tinyvlm.questions import Turn
from tinyvlm.scene import LEGACY_SPEC, WIDE_SPEC, Scene, SceneSpec, sample_scene

HELDOUT_SEED = 20261129  # training uses 1234; per-example streams never meet
WIDE_SEED = 777


@dataclass(frozen=True)
class EvalSet:
    name: str
    spec: SceneSpec
    seed: int
    min_questions: int


# The first model's sets, unchanged: the same pictures and questions as when it was evaluated.
HELDOUT = EvalSet("heldout", LEGACY_SPEC, HELDOUT_SEED, 2000)
WIDE = EvalSet("wide", WIDE_SPEC, WIDE_SEED, 600)


@dataclass(frozen=True)
class Item:
    scene: Scene
    turns: list[Turn]
    system: str | None = None  # None: the chat template's default
    renderer: str = "first"  # "first" (tinyvlm.render) or "second" (tinyvlm.second_renderer)
    text_first: bool = False  # the first turn's question before its picture, as many clients send it


def items(eval_set: EvalSet, min_questions: int | None = None) -> Iterator[Item]:
    """Conversations until at least ``min_questions`` questions are asked."""
    target = eval_set.min_questions if min_questions is None else min_questions
    asked, index = 0, 0
    while asked < target:
        rng = random.Random(f"{eval_set.name}-{eval_set.seed}-{index}")
        scene = sample_scene(rng, eval_set.spec)
        turns = questions.conversation(scene, rng, held_out=True)
        asked += len(turns)
        index += 1
        yield Item(scene, turns)


def client_image(item: Item, seed: int = 0) -> Image.Image:
    """Full-size rendering, encoded as the scene's PNG/JPEG and decoded like a server would."""
    if item.renderer == "second":
        data = second_renderer.encode(second_renderer.draw(item.scene, seed), item.scene)
    else:
        data = render.encode(render.render(item.scene, 1.0, seed=seed), item.scene)
    return Image.open(io.BytesIO(data)).convert("RGB")
