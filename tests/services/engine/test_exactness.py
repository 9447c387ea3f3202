"""Greedy fp32 output of the engine is token-identical to a from-scratch batch-of-one
``model.generate`` of the same conversation, whatever the batching and caching (bundled model)."""

from __future__ import annotations

import copy
import threading
import time
from typing import Any

import pytest

from bench.common import draw_image, image_input, load_bundled
from bench.engine_workloads import QUESTIONS as WORKLOAD_QUESTIONS
from services.engine import FinishReason, GenerationRequest, SamplingParams, TokenEvent, Usage
from tests.services.engine.reference import assert_greedy_match, check, reference, run_all, tokens_of, user

QUESTIONS = WORKLOAD_QUESTIONS[:6]  # the bench workload's questions


def _req(
    proc: Any,
    i: int,
    max_tokens: int = 12,
    size: tuple[int, int] = (64, 64),
    ignore_eos: bool = False,
    **kw: Any,
) -> tuple[GenerationRequest, list[bytes]]:
    png = draw_image(i, size)
    msgs = [user(QUESTIONS[i % len(QUESTIONS)])]
    sampling = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos)
    return GenerationRequest(f"r{i}-{size[0]}", msgs, [image_input(proc, png)], sampling, **kw), [png]


def _free_aspect(proc: Any) -> Any:
    """The bundled processor without its fixed square: GLM-4V's own resize, one grid per aspect ratio
    (a real checkpoint's batches mix grids)."""
    free = copy.deepcopy(proc)
    free.image_processor.square_side = None
    return free


class _Recorder:
    """Every event by request id, the order requests finished in, and a wait for ``n`` of them."""

    def __init__(self) -> None:
        self.events: dict[str, list[TokenEvent]] = {}
        self.finished: list[str] = []
        self._done = threading.Semaphore(0)

    def record(self, ev: TokenEvent) -> None:
        self.events.setdefault(ev.request_id, []).append(ev)
        if ev.finished:
            self.finished.append(ev.request_id)
            self._done.release()

    def wait(self, n: int, timeout_s: float = 60) -> None:
        for _ in range(n):
            assert self._done.acquire(timeout=timeout_s)


@pytest.mark.parametrize("prefetch", [False, True], ids=["inline-vision", "vision-prefetch"])
def test_single_and_batched_match_reference(bundled, make_engine, bundled_tie_tol, prefetch):
    model, proc = bundled
    engine = make_engine(model, proc, vision_prefetch=prefetch)
    # The model answers in a word or two; ignoring EOS keeps all eight running until they batch.
    reqs = [_req(proc, i, ignore_eos=True) for i in range(8)]
    text_only = GenerationRequest(
        "t", [user("Say something.", image=False)], [], SamplingParams(max_tokens=12)
    )
    single = engine.generate_sync(reqs[0][0])
    check(single, model, proc, reqs[0][0], reqs[0][1], bundled_tie_tol)
    batched = run_all(engine, [r for r, _ in reqs] + [text_only])
    for req, pngs in [*reqs, (text_only, [])]:
        check(batched[req.request_id], model, proc, req, pngs, bundled_tie_tol)
    assert max(engine.stats().batch_sizes) >= 8


def test_bf16_batched_match_batch_of_one_reference(make_engine):
    """bf16 mode is mixed precision (an fp32 first attention layer, an fp32 KV cache for it): batched
    and prefix-cached answers still equal the bf16 model's own batch-of-one ``generate``."""
    model, proc = load_bundled("bf16")
    engine = make_engine(model, proc)
    reqs = [_req(proc, i, ignore_eos=True) for i in range(6)]
    batched = run_all(engine, [r for r, _ in reqs])
    for req, pngs in reqs:
        check(batched[req.request_id], model, proc, req, pngs)
    assert max(engine.stats().batch_sizes) >= 6


def test_mixed_image_sizes_in_one_batch(bundled, make_engine, bundled_tie_tol):
    model, proc = bundled[0], _free_aspect(bundled[1])
    engine = make_engine(model, proc)
    reqs = [_req(proc, i, size=s) for i, s in enumerate([(64, 64), (112, 80), (48, 128), (128, 128)])]
    grids = {tuple(r.images[0].image_grid_thw[0].tolist()) for r, _ in reqs}
    assert len(grids) >= 3
    out = run_all(engine, [r for r, _ in reqs])
    for req, pngs in reqs:
        check(out[req.request_id], model, proc, req, pngs, bundled_tie_tol)


def test_sequences_joining_mid_flight(bundled, make_engine, bundled_tie_tol):
    model, proc = bundled
    engine = make_engine(model, proc, batch_window_ms=0)
    first, first_png = _req(proc, 0, max_tokens=40)
    first.sampling = SamplingParams(max_tokens=40, ignore_eos=True)  # runs long enough for 3 to join
    joiners = [_req(proc, i, max_tokens=8) for i in range(1, 4)]
    rec = _Recorder()
    events = rec.events

    def on_event(ev: TokenEvent) -> None:
        rec.record(ev)
        # each new token of the long request lets one more request join the running batch
        if ev.request_id == first.request_id and 2 <= ev.index <= 4:
            req, _ = joiners[ev.index - 2]
            engine.submit(req, on_event)

    engine.submit(first, on_event)
    rec.wait(4)
    stats = engine.stats()
    sizes = stats.batch_sizes
    assert sizes.get(2, 0) + sizes.get(3, 0) + sizes.get(4, 0) > 0  # they ran together with the first
    assert stats.mixed_steps > 0  # a joiner's prefill stepped the running rows in its forward
    check(events[first.request_id], model, proc, first, first_png, bundled_tie_tol)
    for req, pngs in joiners:
        check(events[req.request_id], model, proc, req, pngs, bundled_tie_tol)


@pytest.mark.parametrize("mix_padding_tokens", [64, 0], ids=["mixed", "separate"])
def test_prefill_steps_running_rows_in_its_forward_exactly(
    bundled, make_engine, bundled_tie_tol, mix_padding_tokens
):
    """Two rows run; three prompts of different widths join at once: their prefill's forward also
    takes the running rows' next token (each left-padded to the prompts' width after a masked gap).
    Every answer equals its batch-of-one reference, mixed or with the prefill stalling the rows."""
    model, proc = bundled[0], _free_aspect(bundled[1])
    engine = make_engine(model, proc, batch_window_ms=0, mix_padding_tokens=mix_padding_tokens)
    running = [_req(proc, i, max_tokens=10, ignore_eos=True) for i in range(2)]
    joiners = [_req(proc, i, size=s) for i, s in [(2, (64, 64)), (3, (112, 80)), (4, (48, 128))]]
    rec = _Recorder()
    events = rec.events

    refused: list[object] = []  # the joiners' submission outcome (the engine swallows callback errors)

    def on_event(ev: TokenEvent) -> None:
        rec.record(ev)
        if ev.request_id == running[0][0].request_id and ev.index == 2:
            refused.extend(engine.submit_many([(r, on_event) for r, _ in joiners]))

    assert engine.submit_many([(r, on_event) for r, _ in running]) == [None] * 2
    rec.wait(2)
    assert refused == [None] * 3
    rec.wait(3)
    assert (engine.stats().mixed_steps > 0) == (mix_padding_tokens > 0)
    for req, pngs in running + joiners:
        check(events[req.request_id], model, proc, req, pngs, bundled_tie_tol)


def test_batch_work_pauses_for_interactive_work_and_resumes_exactly(bundled, make_engine, bundled_tie_tol):
    """Batch-priority rows are parked (not stepped) while an interactive row runs, a parked row can be
    cancelled, and the rest resume where they stopped: every answer equals its batch of one."""
    model, proc = bundled
    engine = make_engine(model, proc, batch_window_ms=0, priority_aging_s=600.0)
    batch = [_req(proc, i, max_tokens=30, ignore_eos=True, priority=1) for i in range(4)]
    urgent, urgent_png = _req(proc, 5, max_tokens=10, ignore_eos=True)
    rec = _Recorder()
    events = rec.events

    def on_event(ev: TokenEvent) -> None:
        rec.record(ev)
        if ev.request_id == batch[0][0].request_id and ev.index == 2:  # batch rows are decoding
            engine.submit(urgent, on_event)
        if ev.request_id == urgent.request_id and ev.index == 3:  # batch rows are parked now
            engine.cancel(batch[3][0].request_id)

    for req, _ in batch:
        engine.submit(req, on_event)
    rec.wait(5)
    assert rec.finished[:2] == [batch[3][0].request_id, urgent.request_id]  # the cancel, then the urgent one
    assert events[batch[3][0].request_id][-1].finish_reason == FinishReason.CANCELLED
    assert engine.stats().batch_sizes.get(1, 0) >= 9  # the urgent row's decode steps ran alone
    check(events[urgent.request_id], model, proc, urgent, urgent_png, bundled_tie_tol)
    for req, pngs in batch[:3]:
        check(events[req.request_id], model, proc, req, pngs, bundled_tie_tol)


def test_a_failed_decode_fails_its_rows_and_the_paused_rows_resume_exactly(
    bundled, make_engine, bundled_tie_tol
):
    """A decode forward raises while batch rows are parked for an interactive row: the interactive
    row fails with the error; the parked rows, not in that forward, keep their KV and finish exactly."""
    model, proc = bundled
    engine = make_engine(model, proc, batch_window_ms=0, priority_aging_s=600.0)
    batch = [_req(proc, i, max_tokens=12, ignore_eos=True, priority=1) for i in range(2)]
    urgent, _ = _req(proc, 5, max_tokens=10, ignore_eos=True)
    rec = _Recorder()
    events = rec.events
    boom = threading.Event()

    def fault(*_: Any) -> None:
        if boom.is_set():
            boom.clear()
            raise RuntimeError("forward fault")

    def on_event(ev: TokenEvent) -> None:
        rec.record(ev)
        if ev.request_id == batch[0][0].request_id and ev.index == 2:  # batch rows are decoding
            engine.submit(urgent, on_event)
        if ev.request_id == urgent.request_id and ev.index == 2:  # batch rows are parked now
            boom.set()  # the urgent row's next decode forward fails

    handle = model.get_decoder().layers[0].register_forward_pre_hook(fault)
    try:
        for req, _ in batch:
            engine.submit(req, on_event)
        rec.wait(3)
    finally:
        handle.remove()
    assert events[urgent.request_id][-1].finish_reason == FinishReason.ERROR
    assert "forward fault" in (events[urgent.request_id][-1].error or "")
    for req, pngs in batch:  # every token, not a failure after the first few
        assert events[req.request_id][-1].finish_reason == FinishReason.LENGTH
        assert len(tokens_of(events[req.request_id])) == req.sampling.max_tokens
        check(events[req.request_id], model, proc, req, pngs, bundled_tie_tol)


def test_held_batch_work_waits_without_spinning_and_resumes_exactly(bundled, make_engine, bundled_tie_tol):
    """``hold_batch`` (interactive work in flight elsewhere in the service): batch rows stop, batch
    arrivals wait, the engine sleeps instead of spinning, and everything resumes exactly."""
    model, proc = bundled
    engine = make_engine(model, proc, batch_window_ms=0, priority_aging_s=600.0)
    running, arriving = (_req(proc, i, max_tokens=20, ignore_eos=True, priority=1) for i in range(2))
    rec = _Recorder()
    events = rec.events
    second_token = threading.Event()

    def on_event(ev: TokenEvent) -> None:
        rec.record(ev)
        if ev.index == 1:
            second_token.set()

    engine.submit(running[0], on_event)
    assert second_token.wait(30)
    engine.hold_batch(True)
    engine.submit(arriving[0], on_event)
    time.sleep(0.1)  # a step in flight when the hold came may still end
    produced, cpu = len(events[running[0].request_id]), engine.stats().step_cpu_s
    time.sleep(0.5)
    assert len(events[running[0].request_id]) == produced and arriving[0].request_id not in events
    assert engine.stats().step_cpu_s - cpu < 0.1  # asleep, not spinning through empty steps
    engine.hold_batch(False)
    rec.wait(2)
    for req, pngs in (running, arriving):
        check(events[req.request_id], model, proc, req, pngs, bundled_tie_tol)


def test_prefix_cache_on_and_off(bundled, make_engine, bundled_tie_tol):
    model, proc = bundled
    reqs = [_req(proc, i) for i in range(3)]
    on = make_engine(model, proc, prefix_cache=True)
    off = make_engine(model, proc, prefix_cache=False)
    got_on, got_off = run_all(on, [r for r, _ in reqs]), run_all(off, [r for r, _ in reqs])
    for req, pngs in reqs:
        ref = reference(model, proc, req.messages, pngs, req.sampling.max_tokens)
        assert_greedy_match(tokens_of(got_on[req.request_id]), ref, bundled_tie_tol)
        assert_greedy_match(tokens_of(got_off[req.request_id]), ref, bundled_tie_tol)
        assert _usage(got_on[req.request_id]).cached_tokens > 50  # the system prompt came from the cache
        assert _usage(got_off[req.request_id]).cached_tokens == 0
    assert on.stats().caches["prefix"].hits >= 3


def test_session_turns_cached_vs_recompute(bundled, make_engine, bundled_tie_tol):
    model, proc = bundled
    engine = make_engine(model, proc)
    png = draw_image(7)
    img = image_input(proc, png)
    msgs: list[dict[str, Any]] = []
    for turn, q in enumerate(["What shape is the red one?", "And its colour?", "Where is it?"]):
        msgs = [*msgs, user(q, image=turn == 0)]
        req = GenerationRequest(f"s{turn}", msgs, [img], SamplingParams(max_tokens=10), session_id="sess-1")
        events = engine.generate_sync(req)
        recompute = engine.generate_sync(
            GenerationRequest(f"s{turn}-full", msgs, [img], SamplingParams(max_tokens=10), use_cache=False)
        )
        assert tokens_of(events) == tokens_of(recompute)
        check(events, model, proc, req, [png], bundled_tie_tol)
        usage = _usage(events)
        if turn:  # everything up to the new question came from the session cache
            assert usage.cached_tokens >= usage.prompt_tokens - 20, usage
        answer = "".join(e.text for e in events)
        msgs = [*msgs, {"role": "assistant", "content": [{"type": "text", "text": answer}]}]
    engine.caches.session.check_integrity()
    assert engine.stats().caches["session"].hits == 2
    entry = engine.caches.session.peek("sess-1")  # the system prompt's KV is the prefix cache's, shared
    assert entry is not None and entry.shared_len > 50
    own_tokens = len(entry.tokens) - entry.shared_len
    assert engine.caches.session.bytes == engine.arch.kv_bytes_per_token() * own_tokens


def test_text_only_session_turns_match_reference(bundled, make_engine, bundled_tie_tol):
    """No image anywhere: prefix and session caches, then a batch mixing text-only and image rows."""
    model, proc = bundled
    engine = make_engine(model, proc)
    msgs: list[dict[str, Any]] = []
    for turn, q in enumerate(["What can you see?", "And the colour?", "Where?"]):
        msgs = [*msgs, user(q, image=False)]
        req = GenerationRequest(f"t{turn}", msgs, [], SamplingParams(max_tokens=10), session_id="text-1")
        events = engine.generate_sync(req)
        check(events, model, proc, req, [], bundled_tie_tol)
        usage = _usage(events)
        assert usage.cached_tokens >= (usage.prompt_tokens - 20 if turn else 50), usage
        answer = "".join(e.text for e in events)
        msgs = [*msgs, {"role": "assistant", "content": [{"type": "text", "text": answer}]}]
    mixed = [_req(proc, 1)[0], GenerationRequest("t-mixed", msgs, [], SamplingParams(max_tokens=10))]
    out = run_all(engine, mixed)
    check(out["t-mixed"], model, proc, mixed[1], [], bundled_tie_tol)
    assert engine.stats().caches["session"].hits == 2


def test_image_cache_hit_vs_miss(bundled, make_engine, bundled_tie_tol):
    model, proc = bundled
    engine = make_engine(model, proc)
    req, pngs = _req(proc, 3)
    miss = engine.generate_sync(req)
    req2 = GenerationRequest("again", [user("How many shapes are there?")], req.images, req.sampling)
    hit = engine.generate_sync(req2)
    stats = engine.stats().caches["image"]
    assert (stats.hits, stats.misses) == (1, 1)
    check(miss, model, proc, req, pngs, bundled_tie_tol)
    check(hit, model, proc, req2, pngs, bundled_tie_tol)
    engine.caches.image.check_integrity()


def _usage(events: list[TokenEvent]) -> Usage:
    assert events[-1].usage is not None
    return events[-1].usage


def test_min_tokens_matches_generate_with_min_new_tokens(bundled, make_engine, bundled_tie_tol):
    """vLLM's ``min_tokens`` is Hugging Face's ``min_new_tokens``: the same tokens, alone or batched
    with rows of other minimums."""
    model, proc = bundled
    engine = make_engine(model, proc)
    reqs = [_req(proc, i, max_tokens=16) for i in range(4)]
    for i, (req, _) in enumerate(reqs):
        req.sampling = SamplingParams(max_tokens=16, min_tokens=3 * i + 2)
    single = engine.generate_sync(reqs[3][0])
    check(single, model, proc, reqs[3][0], reqs[3][1], bundled_tie_tol)
    batched = run_all(engine, [r for r, _ in reqs])
    for req, pngs in reqs:
        assert len(tokens_of(batched[req.request_id])) >= req.sampling.min_tokens
        check(batched[req.request_id], model, proc, req, pngs, bundled_tie_tol)
