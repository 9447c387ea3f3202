"""Model-agnosticism: tiny random Glm4v, Qwen2-VL and Llava models through the same engine, compared
with ``model.generate`` (random weights: a divergence is allowed only at a near tie of the logits)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.common import draw_image, image_input
from services.engine import GenerationRequest, SamplingParams
from tests.services.engine.reference import check, run_all, tokens_of, user

TIE = 1e-4


@pytest.mark.parametrize("arch", ["glm4v", "qwen2_vl", "llava"])
def test_batched_prefix_image_and_session(arch, tiny_models, make_engine):
    model, proc = tiny_models[arch]
    engine = make_engine(model, proc)
    pngs = [
        draw_image(i, (64, 64) if arch == "llava" else [(64, 64), (96, 64), (64, 112)][i % 3])
        for i in range(5)
    ]
    reqs = [
        GenerationRequest(
            f"{arch}-{i}",
            [user(f"What is shape {i}?", image=i != 4)],
            [image_input(proc, pngs[i])] if i != 4 else [],
            SamplingParams(max_tokens=10),
        )
        for i in range(5)
    ]
    out = run_all(engine, reqs)
    for i, req in enumerate(reqs):
        check(out[req.request_id], model, proc, req, pngs[i : i + 1] if i != 4 else [], TIE)
        usage = out[req.request_id][-1].usage
        assert usage is not None and usage.cached_tokens > 0  # system prompt from the prefix cache

    # image cache hit + session turn 2 on the same conversation
    first = reqs[0]
    answer = "".join(e.text for e in out[first.request_id])
    msgs: list[dict[str, Any]] = [
        *first.messages,
        {"role": "assistant", "content": [{"type": "text", "text": answer}]},
        user("And its colour?", image=False),
    ]
    t1 = GenerationRequest("t1", first.messages, first.images, first.sampling, session_id="s")
    engine.generate_sync(t1)
    t2 = GenerationRequest("t2", msgs, first.images, first.sampling, session_id="s")
    ev = engine.generate_sync(t2)
    check(ev, model, proc, t2, pngs[:1], TIE)
    full = engine.generate_sync(
        GenerationRequest("t2-full", msgs, first.images, first.sampling, use_cache=False)
    )
    assert tokens_of(ev) == tokens_of(full)
    assert ev[-1].usage.cached_tokens > len(first.images) and engine.stats().caches["image"].hits >= 1
    for cache in engine.caches.all():
        cache.check_integrity()
