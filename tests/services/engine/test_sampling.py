"""Sampling parameters, stop strings, streaming text, and quantized modes end to end."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from typing import Any

import pytest
import torch

from bench.common import draw_image, image_input, load_bundled
from services.engine import FinishReason, GenerationRequest, RequestRejected, SamplingParams
from services.engine.detok import Detokenizer
from services.engine.sampling import NonFiniteLogits, is_greedy, make_generator, sample
from tests.services.engine.reference import run_all, tokens_of, user


def _req(proc: Any, rid: str, sampling: SamplingParams) -> GenerationRequest:
    return GenerationRequest(
        rid, [user("What colour is the circle?")], [image_input(proc, draw_image(2))], sampling
    )


def test_seeded_sampling_does_not_depend_on_the_batch(bundled, make_engine):
    model, proc = bundled
    engine = make_engine(model, proc)
    params = SamplingParams(max_tokens=16, temperature=1.5, top_p=0.9, top_k=50, seed=1234, ignore_eos=True)
    alone = tokens_of(engine.generate_sync(_req(proc, "alone", params)))
    others = [_req(proc, f"o{i}", SamplingParams(max_tokens=16, temperature=1.0, seed=i)) for i in range(5)]
    together = run_all(engine, [_req(proc, "batched", params), *others])
    assert tokens_of(together["batched"]) == alone
    others_seeds = [
        tokens_of(engine.generate_sync(_req(proc, f"seed{s}", dataclasses.replace(params, seed=s))))
        for s in (7, 99, 2024)
    ]
    assert any(o != alone for o in others_seeds)  # the seed matters (16 draws at temperature 1.5)


def test_top_k_one_is_greedy(bundled, make_engine):
    model, proc = bundled
    engine = make_engine(model, proc)
    greedy = tokens_of(engine.generate_sync(_req(proc, "g", SamplingParams(max_tokens=10))))
    k1 = tokens_of(
        engine.generate_sync(_req(proc, "k", SamplingParams(max_tokens=10, temperature=2.0, top_k=1)))
    )
    assert greedy == k1


def test_sample_function_filters():
    logits = torch.tensor([[0.0, 5.0, 4.9, -3.0]] * 200)
    gens: list[torch.Generator | None] = [make_generator(i) for i in range(200)]
    top2 = sample(logits, [SamplingParams(temperature=1.0, top_k=2)] * 200, gens)
    assert set(top2) == {1, 2}
    nucleus = sample(logits, [SamplingParams(temperature=1.0, top_p=0.5)] * 200, gens)
    assert set(nucleus) == {1}


def test_tiny_temperatures_are_greedy():
    """Regression: 1e-320 divided the logits into inf (and took the engine down); below 1e-5 is greedy."""
    logits = torch.tensor([[0.0, 5.0, 4.9, -3.0], [2.0, 0.0, 1.0, 0.5]])
    for t in (0.0, 1e-320, 5e-324, 1e-38, 9.9e-6):
        params = SamplingParams(temperature=t, seed=1)
        assert is_greedy(params)
        assert sample(logits, [params] * 2, [make_generator(1)] * 2) == [1, 0]
    assert not is_greedy(SamplingParams(temperature=1e-5))


@pytest.mark.parametrize(
    "bad_row, params, cause",
    [
        ([0.0, float("nan"), 1.0, 2.0], SamplingParams(), "non-finite logits from the model (NaN)"),
        ([0.0, float("inf"), 1.0, 2.0], SamplingParams(temperature=1.0), "model (inf)"),
        ([0.0, float("-inf"), 1.0, 2.0], SamplingParams(temperature=0.7, top_k=2), "model (inf)"),
        ([0.0, 3e38, 1.0, 2.0], SamplingParams(temperature=1e-4), "after temperature 0.0001 (inf)"),
    ],
)
def test_non_finite_row_fails_alone(bad_row, params, cause):
    """A row with NaN/inf (in the logits or after temperature) gets an error; the other rows get the
    very tokens they get without it (greedy and seeded)."""
    good = torch.tensor([[0.0, 5.0, 4.9, -3.0], [1.0, 1.2, 0.9, 1.1]])
    good_params = [SamplingParams(), SamplingParams(temperature=1.0, top_p=0.9, seed=5)]
    alone = sample(good, good_params, [None, make_generator(5)])
    logits = torch.cat([good[:1], torch.tensor([bad_row]), good[1:]])
    out = sample(
        logits, [good_params[0], params, good_params[1]], [None, make_generator(9), make_generator(5)]
    )
    assert isinstance(out[1], NonFiniteLogits) and cause in str(out[1])
    assert [out[0], out[2]] == alone


def test_stop_string_cuts_the_text(bundled, make_engine):
    model, proc = bundled
    engine = make_engine(model, proc)
    # ignore_eos: the trained model answers in one word; the cut needs a longer text
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    full = engine.generate_sync(_req(proc, "full", params))
    text = "".join(e.text for e in full)
    assert len(text) >= 4, text
    stop = text[len(text) // 2 :][:3]
    cut = engine.generate_sync(_req(proc, "cut", replace(params, stop=(stop,))))
    assert cut[-1].finish_reason == FinishReason.STOP
    assert "".join(e.text for e in cut) == text[: text.find(stop)]


class _CharTokenizer:
    """Token i decodes to VOCAB[i]: enough to drive the detokenizer without a model."""

    VOCAB = ("he", "ll", "o", " w", "or", "ld", "\ufffd")

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(self.VOCAB[i] for i in ids)


def test_detokenizer_holds_back_possible_stop_prefixes():
    d = Detokenizer(_CharTokenizer(), stop=("o w",))
    ids: list[int] = []
    deltas = []
    for tok in [0, 1, 2, 3, 4]:
        ids.append(tok)
        delta, stopped = d.step(ids, final=False)
        deltas.append(delta)
        if stopped:
            break
    assert stopped and "".join(deltas) == "hell"
    d2 = Detokenizer(_CharTokenizer(), stop=())
    assert d2.step([0], final=False) == ("he", False)
    assert d2.step([0, 6], final=False) == ("", False)  # incomplete character held back
    assert d2.step([0, 6], final=True) == ("", False)  # and dropped if the answer ends there


def test_incremental_text_equals_full_decode(bundled):
    tok = bundled[1].tokenizer
    text = "The red circle is left of the big blue star, 3 shapes in all: ünïcödé ✓ ok"
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    d = Detokenizer(tok, stop=())
    out = "".join(d.step(ids[: i + 1], final=i == len(ids) - 1)[0] for i in range(len(ids)))
    assert out == tok.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("mode", ["bf16", "int8"])
def test_quantized_modes_run_end_to_end(mode, make_engine):
    model, proc = load_bundled(mode)
    engine = make_engine(model, proc)
    reqs = [_req(proc, f"q{i}", SamplingParams(max_tokens=6)) for i in range(3)]
    out = run_all(engine, reqs)
    for r in reqs:
        assert out[r.request_id][-1].finish_reason in (FinishReason.LENGTH, FinishReason.STOP)
        assert tokens_of(out[r.request_id])


def test_min_tokens_bans_eos_until_reached(bundled, make_engine):
    """vLLM's ``min_tokens``: the one-word answer goes on to exactly ``min_tokens`` tokens before EOS
    may end it; sampled rows never draw EOS before that either."""
    model, proc = bundled
    engine = make_engine(model, proc)
    eos = set(engine.eos_ids)
    short = tokens_of(engine.generate_sync(_req(proc, "short", SamplingParams(max_tokens=32))))
    assert short[-1] in eos  # the trained model answers in a few tokens, then EOS
    floor = len(short) + 6
    at_least = SamplingParams(max_tokens=32, min_tokens=floor)
    longer = tokens_of(engine.generate_sync(_req(proc, "min", at_least)))
    assert len(longer) >= floor and not eos & set(longer[:floor])
    sampled = SamplingParams(max_tokens=10, min_tokens=10, temperature=1.5, seed=3)
    events = engine.generate_sync(_req(proc, "sampled", sampled))
    assert events[-1].finish_reason == FinishReason.LENGTH and not eos & set(tokens_of(events))


def test_min_tokens_defers_stop_strings(bundled, make_engine):
    model, proc = bundled
    engine = make_engine(model, proc)
    answer = "".join(e.text for e in engine.generate_sync(_req(proc, "a", SamplingParams(max_tokens=8))))
    stop = answer.strip()[:2]
    cut = engine.generate_sync(_req(proc, "cut", SamplingParams(max_tokens=8, stop=(stop,))))
    assert cut[-1].finish_reason == FinishReason.STOP and stop not in "".join(e.text for e in cut)
    held = engine.generate_sync(_req(proc, "held", SamplingParams(max_tokens=8, min_tokens=8, stop=(stop,))))
    assert held[-1].finish_reason == FinishReason.LENGTH and stop in "".join(e.text for e in held)


def test_sample_function_never_draws_a_banned_token():
    logits = torch.tensor([[0.0, 5.0, 4.9, -3.0]] * 100)
    params = [SamplingParams(temperature=1.0)] * 50 + [SamplingParams()] * 50
    gens: list[torch.Generator | None] = [make_generator(i) for i in range(50)] + [None] * 50
    out = sample(logits, params, gens, banned=[(1,)] * 100)
    assert 1 not in out and out[50:] == [2] * 50
    assert logits[0, 1] == 5.0  # the caller's logits are left as they were


def test_min_tokens_above_max_tokens_is_rejected(bundled, make_engine):
    model, proc = bundled
    engine = make_engine(model, proc)
    with pytest.raises(RequestRejected, match="min_tokens must be in"):
        engine.validate(_req(proc, "bad", SamplingParams(max_tokens=4, min_tokens=5)))
