"""Several images per request and per conversation: greedy output is token-identical to a
batch-of-one ``model.generate`` with two and three images, in one message and across turns, with
the session cache and in a batch; an image shown twice is encoded once (M-RoPE positions right for
each image: the reference computes them itself, from the whole prompt)."""

from __future__ import annotations

from typing import Any

from bench.common import draw_image, image_input
from services.engine import GenerationRequest, SamplingParams, TokenEvent
from tests.services.engine.reference import check, run_all, tokens_of


def turn(text: str, images: int) -> dict[str, Any]:
    return {"role": "user", "content": [*[{"type": "image"}] * images, {"type": "text", "text": text}]}


def answer_turn(events: list[TokenEvent]) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "text", "text": "".join(e.text for e in events)}]}


def test_two_and_three_images_in_one_message(bundled, make_engine, bundled_tie_tol):
    model, proc = bundled
    engine = make_engine(model, proc)
    pngs = [draw_image(s, (96, 96)) for s in (21, 22, 23)]
    images = [image_input(proc, p) for p in pngs]
    cases = [("two", "What colour is the circle?", pngs[:2]), ("three", "How many shapes?", pngs)]
    cases.append(("one", "What shape is big?", pngs[2:]))
    reqs = [
        (
            GenerationRequest(rid, [turn(q, len(shown))], [images[pngs.index(p)] for p in shown]),
            shown,
        )
        for rid, q, shown in cases
    ]
    for req, shown in reqs:  # alone first, then all three batched
        req.sampling = SamplingParams(max_tokens=10)
        check(engine.generate_sync(req), model, proc, req, shown, bundled_tie_tol)
    again = [GenerationRequest(f"{r.request_id}-b", r.messages, r.images, r.sampling) for r, _ in reqs]
    batched = run_all(engine, again)
    for req, shown in reqs:
        check(batched[f"{req.request_id}-b"], model, proc, req, shown, bundled_tie_tol)


def test_images_added_across_turns_with_the_session_cache(bundled, make_engine, bundled_tie_tol):
    """Turn 1 shows A, turn 2 adds B, turn 3 adds C and shows A again: every turn equals the
    reference and an uncached recompute, later turns reuse the session KV, and A's features are
    computed once although it is in the prompt twice."""
    model, proc = bundled
    engine = make_engine(model, proc)
    a, b, c = (draw_image(s, (96, 96)) for s in (31, 32, 33))
    inputs = {png: image_input(proc, png) for png in (a, b, c)}
    shown: list[bytes] = []
    msgs: list[dict[str, Any]] = []
    for n, (question, new) in enumerate(
        [("What colour is the circle?", [a]), ("And in this one?", [b]), ("And these two?", [c, a])]
    ):
        shown += new
        msgs = [*msgs, turn(question, len(new))]
        req = GenerationRequest(
            f"m{n}", msgs, [inputs[p] for p in shown], SamplingParams(max_tokens=10), session_id="multi-1"
        )
        events = engine.generate_sync(req)
        alone = GenerationRequest(f"m{n}-full", msgs, req.images, req.sampling, use_cache=False)
        assert tokens_of(events) == tokens_of(engine.generate_sync(alone))
        check(events, model, proc, req, shown, bundled_tie_tol)
        usage = events[-1].usage
        assert usage is not None
        if n:
            assert usage.cached_tokens >= usage.prompt_tokens - 40, usage  # the history came from the KV
        msgs = [*msgs, answer_turn(events)]
    stats = engine.stats().caches["image"]
    assert stats.misses == 3  # A, B, C encoded once each (the uncached recomputes bypass the cache)
    engine.caches.session.check_integrity()
