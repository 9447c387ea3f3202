"""The training objective: the shared-prefix forward equals the plain forward, and the per-token
labels say what the picture shows where."""

import random

import pytest
import torch

from services.vlm.patch_embed import linear_patch_embed
from tinyvlm import attention, build, data, labels, objective, questions, referents, vocab
from tinyvlm.scene import Glyph, Obj, Scene, sample_scene


@pytest.fixture(scope="module")
def processor() -> object:
    return build.build_processor()


def batch_of(processor: object, n: int) -> dict[str, torch.Tensor]:
    examples = []
    for i in range(n):
        rng = random.Random(i)
        scene = sample_scene(rng)
        turns = questions.conversation(scene, rng, n_turns=rng.randint(*data.TRAIN_TURNS))
        examples.append(data.make_example(processor, scene, turns, seed=i))
    tok = processor.tokenizer  # type: ignore[attr-defined]
    return data.collate(examples, processor, tok.pad_token_id)


def test_shared_prefix_forward_equals_full_forward(processor: object) -> None:
    torch.manual_seed(0)
    model = build.build_model(processor.tokenizer, seed=0)  # type: ignore[attr-defined]
    batch = batch_of(processor, 3)
    model_inputs = {k: v for k, v in batch.items() if k != "token_labels" and not k.startswith("ref_")}
    with torch.no_grad():
        full = model(**model_inputs).logits
        forward = objective.forward_logits(model, batch, objective.image_features(model, batch))
        shared, prefix = forward.logits, forward.prefix
    first_image = int((batch["input_ids"][0] == model.config.image_token_id).nonzero()[0])
    assert 100 <= prefix <= first_image  # the system prompt, never an image token
    real = batch["attention_mask"][:, prefix:].bool()
    assert torch.allclose(full[:, prefix:][real], shared[real], atol=1e-4)


def test_gradients_reach_the_vision_encoder_and_the_heads(processor: object) -> None:
    model = build.build_model(processor.tokenizer, seed=0)  # type: ignore[attr-defined]
    heads = objective.TokenHeads(objective.text_hidden_size(model))
    referent_head = referents.ReferentHead(objective.text_hidden_size(model))
    heads.add_module("referents", referent_head)
    weights = objective.Weights(token=0.5, question=0.3, referent=1.0)
    out = objective.step(model, heads, batch_of(processor, 2), weights)
    out.loss.backward()
    assert out.question_loss > 0 and out.answer_loss > 0 and out.referent_loss > 0
    assert model.model.visual.patch_embed.proj.weight.grad is not None
    assert heads.linear.weight.grad is not None and heads.linear.weight.grad.abs().sum() > 0
    referent_grad = referent_head.linear.weight.grad
    assert referent_grad is not None and referent_grad.abs().sum() > 0


def _scene(objects: tuple[Obj, ...], glyph: Glyph | None = None) -> Scene:
    return Scene(280, 280, (240, 240, 240), (0.0, 0.0), 0.0, objects, glyph, "png", 90)


def test_token_labels_say_what_each_cell_token_shows() -> None:
    big_red_circle = Obj("circle", "red", "big", (0, 0), 0.0, 0.0, 0.44, (220, 30, 30))
    small_blue_star = Obj("star", "blue", "small", (2, 2), 0.1, -0.1, 0.24, (30, 70, 220))
    scene = _scene((big_red_circle, small_blue_star), Glyph("7", (2, 0), (15, 15, 15)))
    grid = labels.token_labels(scene, 3, 3).reshape(3, 3, len(labels.COLUMNS))
    colour, shape, size, cell, glyph = (grid[..., i] for i in range(len(labels.COLUMNS)))
    assert colour[0, 0] == 1 + list(vocab.COLOURS).index("red")
    assert shape[0, 0] == 1 + vocab.SHAPES.index("circle")
    assert size[0, 0] == 1 + vocab.SIZES.index("big") and cell[0, 0] == 1  # top left is cell 1
    assert colour[2, 2] == 1 + list(vocab.COLOURS).index("blue") and shape[2, 2] == 1 + vocab.SHAPES.index(
        "star"
    )
    assert glyph[0, 2] == 1 + vocab.GLYPHS.index("7") and colour[0, 2] == 0
    assert int((colour > 0).sum()) == 2 and int((glyph > 0).sum()) == 1  # the other six cells are empty
    assert labels.kinds(grid.reshape(9, -1)).reshape(3, 3).tolist() == [[1, 0, 2], [0, 0, 0], [0, 0, 1]]


def test_linear_patch_embed_matches_the_conv(processor: object) -> None:
    model = build.build_model(processor.tokenizer, seed=0)  # type: ignore[attr-defined]
    batch = batch_of(processor, 1)
    with torch.no_grad():
        conv = model.model.visual.patch_embed(batch["pixel_values"])
        linear_patch_embed(model)
        linear = model.model.visual.patch_embed(batch["pixel_values"])
    assert torch.allclose(conv, linear, atol=1e-5)


def test_question_labels_cover_the_user_words_only(processor: object) -> None:
    tok = processor.tokenizer  # type: ignore[attr-defined]
    batch = batch_of(processor, 1)
    ids, gold = batch["input_ids"][0], batch["question_labels"][0]
    kept = tok.decode(ids[gold != data.IGNORE])
    rng = random.Random(0)
    scene = sample_scene(rng)
    turns = questions.conversation(scene, rng, n_turns=rng.randint(*data.TRAIN_TURNS))
    assert kept == "".join(turn.question for turn in turns)


def test_pointer_layers_attention_matches_eager_and_keeps_the_pointer_weights(processor: object) -> None:
    """SDPA outside the pointer layers, with eager's padding mask: the same losses as eager everywhere
    (float rounding apart), and the pointer loss still reads its two layers' weights."""
    model = build.build_model(processor.tokenizer, seed=0)  # type: ignore[attr-defined]
    heads = objective.TokenHeads(objective.text_hidden_size(model))
    heads.add_module("referents", referents.ReferentHead(objective.text_hidden_size(model)))
    batch = batch_of(processor, 3)
    assert (batch["attention_mask"] == 0).any()  # padded rows: the mask matters
    weights = objective.Weights(token=0.5, question=0.3, referent=1.0, pointer=1.0)
    model.train()  # as training runs it (no dropout in this config)
    losses = {}
    for implementation in ("eager", attention.NAME):
        model.model.language_model.set_attn_implementation(implementation)
        out = objective.step(model, heads, batch, weights)
        losses[implementation] = torch.stack([out.answer_loss, out.question_loss, out.pointer_loss])
    assert losses[attention.NAME][2] > 0  # the pointer layers' weights were read
    assert torch.allclose(losses["eager"], losses[attention.NAME], rtol=1e-4, atol=1e-5)
