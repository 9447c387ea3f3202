"""Scheduling and request lifecycle: cancellation, deadlines, the admission window, rejections,
failures that stay contained, drain on stop, the asyncio API."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import torch

from bench.common import draw_image, image_input
from services.engine import (
    Engine,
    FinishReason,
    GenerationRequest,
    ImageInput,
    RequestRejected,
    SamplingParams,
    TokenEvent,
)
from tests.services.engine.reference import run_all, tokens_of, user


def _req(proc: Any, rid: str, max_tokens: int = 8, **kw: Any) -> GenerationRequest:
    """Long requests ignore EOS so they keep running whatever the (trained) model answers."""
    return GenerationRequest(
        rid,
        [user("What colour is the circle?")],
        [image_input(proc, draw_image(1))],
        SamplingParams(max_tokens=max_tokens, ignore_eos=max_tokens > 8),
        **kw,
    )


def test_cancel_frees_the_slot_within_one_step(bundled, make_engine):
    model, proc = bundled
    engine = make_engine(model, proc, max_batch=1)
    events: dict[str, list[TokenEvent]] = {"long": [], "next": []}
    started, finished = threading.Event(), threading.Semaphore(0)

    def on_event(ev: TokenEvent) -> None:
        events[ev.request_id].append(ev)
        if ev.request_id == "long" and ev.index == 2:
            started.set()
        if ev.finished:
            finished.release()

    engine.submit(_req(proc, "long", max_tokens=400), on_event)
    engine.submit(_req(proc, "next"), on_event)  # waits: the only slot is taken
    assert started.wait(30)
    assert engine.stats().waiting == 1
    steps_before = engine.stats().steps
    assert engine.cancel("long")
    assert finished.acquire(timeout=30) and finished.acquire(timeout=30)
    long_ev = events["long"]
    assert long_ev[-1].finish_reason == FinishReason.CANCELLED and len(tokens_of(long_ev)) < 400
    # the cancelled row left at the very next step and "next" was prefilled right after
    first_next = events["next"][0]
    assert first_next.index == 0 and events["next"][-1].finished
    assert engine.stats().steps - steps_before <= 2 + len(tokens_of(events["next"]))
    assert not engine.cancel("long")  # no longer known


def test_expired_requests_never_run(bundled, make_engine):
    model, proc = bundled
    engine = make_engine(model, proc)
    ev = engine.generate_sync(_req(proc, "late", deadline=time.time() - 1))
    assert [e.finish_reason for e in ev] == [FinishReason.EXPIRED] and tokens_of(ev) == []
    s = engine.stats()
    assert s.prefill_steps == 0 and s.prompt_tokens == 0


def test_deadline_during_the_run_stops_it(bundled, make_engine):
    model, proc = bundled
    engine = make_engine(model, proc)
    ev = engine.generate_sync(_req(proc, "slow", max_tokens=500, deadline=time.time() + 0.3))
    assert ev[-1].finish_reason == FinishReason.EXPIRED and 0 < len(tokens_of(ev)) < 500


def test_window_never_delays_a_lone_request(bundled, make_engine):
    model, proc = bundled
    engine = make_engine(model, proc, batch_window_ms=2000)
    t0 = time.monotonic()
    ev = engine.generate_sync(_req(proc, "alone", max_tokens=2))
    assert time.monotonic() - t0 < 1.0 and ev[-1].timings.queue < 0.1


def test_window_groups_arrivals_into_one_prefill(bundled, make_engine):
    model, proc = bundled
    engine = make_engine(model, proc, batch_window_ms=300)
    events: list[TokenEvent] = []
    done = threading.Semaphore(0)

    def on_event(ev: TokenEvent) -> None:
        events.append(ev)
        if ev.finished:
            done.release()

    engine.submit(_req(proc, "a", max_tokens=200), on_event)
    while not events:
        time.sleep(0.005)
    for rid in "bcd":  # arrive while "a" runs: admitted together after the window, one prefill
        engine.submit(_req(proc, rid, max_tokens=4), on_event)
    for _ in range(4):
        assert done.acquire(timeout=60)
    assert engine.stats().prefill_steps == 2


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(sampling=SamplingParams(max_tokens=0)), "max_tokens"),
        (dict(sampling=SamplingParams(max_tokens=10_000)), "max_tokens"),
        (dict(sampling=SamplingParams(temperature=-1)), "temperature"),
        (dict(sampling=SamplingParams(top_p=0)), "top_p"),
        (dict(sampling=SamplingParams(top_k=-2)), "top_k"),
        (dict(sampling=SamplingParams(stop=("",))), "stop"),
        (dict(images=[]), "images given for 1 image parts"),
        (dict(messages=[]), "non-empty"),
    ],
)
def test_bad_requests_are_refused(bundled, make_engine, change, match):
    model, proc = bundled
    engine = make_engine(model, proc, prewarm=False, max_context_tokens=2048)
    base = _req(proc, "bad")
    req = GenerationRequest(**{**base.__dict__, **change})
    with pytest.raises(RequestRejected, match=match):
        engine.submit(req, lambda ev: None)
    with pytest.raises(RequestRejected, match=match):
        engine.validate(req)
    assert engine.stats().submitted == 0


def test_a_prompt_refused_on_the_engine_thread_ends_with_a_rejected_event(bundled, make_engine):
    """What only the prompt shows (image tensors, the context) is checked on the engine thread:
    the request ends with one REJECTED event saying why, its id is free again, the others run."""
    model, proc = bundled
    engine = make_engine(model, proc, prewarm=False, max_context_tokens=2048)
    good = image_input(proc, draw_image(1))
    assert good.pixel_values is not None
    too_long = GenerationRequest("long", [user("x" * 12000)], [good], SamplingParams(max_tokens=4))
    bad_tensor = ImageInput(good.pixel_values[:-4], good.image_grid_thw, good.digest)
    cut = GenerationRequest("tensor", [user("hi")], [bad_tensor], SamplingParams(max_tokens=4))
    cases = {"long": (too_long, "exceeds the context"), "tensor": (cut, "shape")}
    for req, match in cases.values():
        with pytest.raises(RequestRejected, match=match):
            engine.validate(req)  # the same checks, at once, for callers that want them
    events: dict[str, list] = {}
    done = threading.Semaphore(0)

    def on_event(ev):
        events.setdefault(ev.request_id, []).append(ev)
        if ev.finished:
            done.release()

    ok = _req(proc, "ok")
    assert engine.submit_many([(req, on_event) for req, _ in cases.values()] + [(ok, on_event)]) == [None] * 3
    for _ in range(3):
        assert done.acquire(timeout=60)
    for rid, (_, match) in cases.items():
        (event,) = events[rid]
        assert event.finish_reason is FinishReason.REJECTED and match in (event.error or "")
        assert event.token_ids == () and event.usage is not None and event.usage.completion_tokens == 0
    assert events["ok"][-1].finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
    stats = engine.stats()
    assert stats.rejected == 2 + 2 and stats.finished.get("rejected") == 2  # two validate calls too
    assert stats.waiting == 0 and stats.running == 0 and stats.prompt_cpu_s > 0
    engine.submit(GenerationRequest("long", [user("hi")], [good], SamplingParams(max_tokens=2)), on_event)
    assert done.acquire(timeout=60) and events["long"][-1].finish_reason is not FinishReason.REJECTED


def test_bad_tensors_are_refused(bundled, make_engine):
    model, proc = bundled
    engine = make_engine(model, proc, prewarm=False)
    good = image_input(proc, draw_image(1))
    assert good.pixel_values is not None
    bad = [
        ImageInput(good.pixel_values[:-4], good.image_grid_thw, good.digest),
        ImageInput(good.pixel_values, torch.tensor([[1, 7, 8]]), good.digest),
        ImageInput(good.pixel_values, torch.tensor([[1, 0, 6]]), good.digest),
        ImageInput(good.pixel_values, torch.tensor([1, 6, 6]), good.digest),
        ImageInput(good.pixel_values, torch.tensor([[1, 6, 6], [1, 6, 6]]), good.digest),
        ImageInput(good.pixel_values * float("nan"), good.image_grid_thw, good.digest),
        ImageInput(good.pixel_values, good.image_grid_thw, good.digest[:16]),
    ]
    for image in bad:
        with pytest.raises(RequestRejected):
            engine.validate(GenerationRequest("x", [user("hi")], [image]))
    engine.validate(GenerationRequest("x", [user("hi")], [good]))  # the good one passes


def test_one_failing_request_does_not_take_the_batch_down(bundled, make_engine):
    """A request whose prefill fails (fault injected in the vision tower for one image) errors alone;
    the requests prefilled in the same batch carry on."""
    model, proc = bundled
    engine = make_engine(model, proc)
    good = [_req(proc, f"ok{i}") for i in range(3)]
    poisoned = GenerationRequest("poison", [user("Where is it?")], [image_input(proc, draw_image(99))])
    marked = poisoned.images[0].pixel_values
    assert marked is not None
    marked[0, 0] = 123.0  # the marker the hook below refuses

    def hook(_: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        pixels = args[0] if args else kwargs["hidden_states"]
        if (pixels == 123.0).any():
            raise RuntimeError("vision tower fault")

    handle = model.model.visual.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        out = run_all(engine, [*good, poisoned])
    finally:
        handle.remove()
    last = out["poison"][-1]
    assert last.finish_reason == FinishReason.ERROR and "vision tower fault" in (last.error or "")
    for r in good:
        assert out[r.request_id][-1].finish_reason in (FinishReason.LENGTH, FinishReason.STOP)
    assert engine.healthy and engine.stats().errors == 1


def test_forward_failure_fails_in_flight_and_the_engine_serves_on(tiny_models, make_engine):
    """A decode forward raises: the sequences in it fail with the error; one failed step is below
    ``max_failed_steps``, so the engine stays healthy and serves the next request (which resets the
    count). K failed steps in a row and device errors: test_faults.py."""
    model, proc = tiny_models["glm4v"]
    engine = make_engine(model, proc, max_failed_steps=3)
    boom = threading.Event()

    def hook(*_: Any) -> None:
        if boom.is_set():
            boom.clear()
            raise RuntimeError("forward fault")

    handle = model.get_decoder().layers[0].register_forward_pre_hook(hook)
    try:
        events: list[TokenEvent] = []

        def on_event(ev: TokenEvent) -> None:
            events.append(ev)
            if ev.index == 0:
                boom.set()  # fail the next forward: the first decode step

        engine.submit(_req(proc, "r", max_tokens=300), on_event)
        deadline = time.monotonic() + 30
        while not (events and events[-1].finished) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert events[-1].finish_reason == FinishReason.ERROR and "forward fault" in (events[-1].error or "")
        assert engine.healthy and engine.last_error is None and engine.stats().failed_steps == 1
        after = engine.generate_sync(_req(proc, "next", max_tokens=4), timeout_s=30)
    finally:
        handle.remove()
    assert after[-1].finish_reason in (FinishReason.LENGTH, FinishReason.STOP) and tokens_of(after)
    assert engine.healthy and engine.stats().failed_steps == 0


def test_callback_exceptions_are_contained(bundled, make_engine):
    model, proc = bundled
    engine = make_engine(model, proc)

    def bad(ev: TokenEvent) -> None:
        raise ValueError("listener bug")

    engine.submit(_req(proc, "a"), bad)
    ev = engine.generate_sync(_req(proc, "b"))
    assert ev[-1].finished and engine.healthy


def test_stop_drains_then_refuses(bundled, make_engine):
    model, proc = bundled
    engine = make_engine(model, proc)
    events: list[TokenEvent] = []
    engine.submit(_req(proc, "a", max_tokens=20), events.append)
    engine.stop(drain_timeout_s=None)
    assert events[-1].finished and events[-1].finish_reason in (FinishReason.LENGTH, FinishReason.STOP)
    with pytest.raises(RequestRejected, match="stopping"):
        engine.submit(_req(proc, "b"), events.append)


def test_stop_with_timeout_cancels_what_is_left(bundled, make_engine):
    model, proc = bundled
    engine = make_engine(model, proc)
    events: list[TokenEvent] = []
    engine.submit(_req(proc, "a", max_tokens=500), events.append)
    engine.stop(drain_timeout_s=0.05)
    assert events[-1].finish_reason == FinishReason.CANCELLED


async def test_async_generate_and_early_exit_cancels(bundled, make_engine):
    model, proc = bundled
    engine = make_engine(model, proc)
    got = [ev async for ev in engine.generate(_req(proc, "a", max_tokens=5))]
    assert got[-1].finished and len(tokens_of(got)) <= 5
    agen = engine.generate(_req(proc, "b", max_tokens=300))
    async for ev in agen:
        if ev.index >= 2:
            break
    await agen.aclose()
    for _ in range(100):
        if engine.stats().running == 0:
            break
        await asyncio.sleep(0.02)
    assert engine.stats().running == 0 and engine.stats().finished.get("cancelled") == 1


def test_admission_is_fifo(bundled, make_engine):
    model, proc = bundled
    engine = make_engine(model, proc, max_batch=2, batch_window_ms=0)
    order: list[str] = []
    done = threading.Semaphore(0)

    def on_event(ev: TokenEvent) -> None:
        if ev.index == 0 and ev.token_ids:
            order.append(ev.request_id)
        if ev.finished:
            done.release()

    names = [f"q{i}" for i in range(6)]
    for rid in names:
        engine.submit(_req(proc, rid, max_tokens=12), on_event)
    for _ in names:
        assert done.acquire(timeout=60)
    assert order == names


def test_requests_submitted_together_share_one_prefill(bundled, make_engine):
    """``submit_many`` on an idle engine: one prefill step for all, the answers those of the requests
    run one by one."""
    model, proc = bundled
    engine = make_engine(model, proc)

    def req(rid: str, i: int) -> GenerationRequest:
        image = image_input(proc, draw_image(10 + i))
        question = [user("What colour is the circle?")]
        return GenerationRequest(rid, question, [image], SamplingParams(max_tokens=6))

    alone = [engine.generate_sync(req(f"alone{i}", i)) for i in range(4)]
    before = dict(engine.stats().prefill_sizes)
    done = threading.Semaphore(0)
    events: dict[str, list[Any]] = {f"together{i}": [] for i in range(4)}

    def on_event(ev: Any) -> None:
        events[ev.request_id].append(ev)
        if ev.finished:
            done.release()

    items = [(req(f"together{i}", i), on_event) for i in range(4)]
    assert engine.submit_many(items) == [None] * 4
    for _ in items:
        assert done.acquire(timeout=60)
    after = engine.stats().prefill_sizes
    assert after.get(4, 0) == before.get(4, 0) + 1
    for i in range(4):
        assert [t for e in events[f"together{i}"] for t in e.token_ids] == [
            t for e in alone[i] for t in e.token_ids
        ]


def test_submit_many_refuses_each_bad_request_alone(bundled, make_engine):
    model, proc = bundled
    engine = make_engine(model, proc, prewarm=False)
    good, twin = _req(proc, "same"), _req(proc, "same")
    bad = GenerationRequest("bad", [user("hi")], [], SamplingParams(max_tokens=0))
    outcome = engine.submit_many([(good, lambda ev: None), (bad, lambda ev: None), (twin, lambda ev: None)])
    assert outcome[0] is None and isinstance(outcome[1], RequestRejected)
    assert isinstance(outcome[2], RequestRejected)  # the same id twice: the second is refused


def test_an_idle_engine_waits_for_requests_being_submitted(bundled, make_engine):
    """Requests that arrive together share a prefill: while another submission is being prepared
    (simulated here by holding the engine's count of them), the first request waits, up to the
    admission window, and both are then prefilled in one step."""
    model, proc = bundled
    engine = make_engine(model, proc, batch_window_ms=5000)

    def req(rid: str, i: int) -> GenerationRequest:
        image = image_input(proc, draw_image(20 + i))
        return GenerationRequest(rid, [user("What colour is it?")], [image], SamplingParams(max_tokens=2))

    engine.generate_sync(req("warm", 9))
    before = engine.stats()
    with engine._cv:
        engine._preparing += 1  # another thread is preparing a request
    first_done = threading.Event()
    engine.submit(req("first", 0), lambda ev: first_done.set() if ev.finished else None)
    time.sleep(0.3)
    assert engine.stats().prefill_steps == before.prefill_steps  # waiting for the other one
    engine.submit(req("second", 1), lambda ev: None)
    with engine._cv:
        engine._preparing -= 1
        engine._cv.notify_all()
    assert first_done.wait(30)
    after = engine.stats()
    assert after.prefill_sizes.get(2, 0) == before.prefill_sizes.get(2, 0) + 1


def test_waiting_for_batch_work_wakes_on_a_batch_submission_only(bundled, make_engine):
    """The batch hold sleeps in ``wait_for_batch_work`` while only interactive work comes: an
    interactive request does not end the wait, a batch one does at once, and it counts until done."""
    model, proc = bundled
    engine = make_engine(model, proc)
    assert engine.wait_for_batch_work(0.01) is False
    woke: list[tuple[bool, float]] = []

    def waiter() -> None:
        started = time.monotonic()
        woke.append((engine.wait_for_batch_work(30.0), time.monotonic() - started))

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.2)
    engine.generate_sync(_req(proc, "interactive", max_tokens=2))  # not batch work: still waiting
    assert not woke
    done = threading.Event()
    batch = _req(proc, "batch", max_tokens=2, priority=1)
    engine.submit(batch, lambda ev: done.set() if ev.finished else None)
    thread.join(10)
    assert woke and woke[0][0] is True and woke[0][1] < 10
    assert done.wait(30)
    assert engine.wait_for_batch_work(0.01) is False  # finished: no batch work left


def test_a_refusal_on_an_idle_engine_reaches_the_step_listeners_at_once(bundled, make_engine):
    """A writer flushes per step: refusals made while rendering, with no step after them, are
    followed by a listener call like a step's events."""
    model, proc = bundled
    engine = make_engine(model, proc, prewarm=False, max_context_tokens=2048)
    order: list[str] = []
    engine.add_step_listener(lambda: order.append("listener"))
    flushed = threading.Event()
    engine.add_step_listener(flushed.set)
    good = image_input(proc, draw_image(1))
    too_long = GenerationRequest("long", [user("x" * 12000)], [good], SamplingParams(max_tokens=4))
    engine.submit(too_long, lambda ev: order.append(f"event:{ev.finish_reason}"))
    assert flushed.wait(5)
    assert order[:2] == ["event:rejected", "listener"]


def test_running_rows_step_while_submissions_keep_coming(bundled, make_engine):
    """Prompts are rendered once per pass of the loop: submissions that keep arriving while others
    render (four clients, each sending its next prompt when the last was refused: refusals free no
    slot and need no step) do not hold up the running sequence."""
    model, proc = bundled
    engine = make_engine(model, proc, prewarm=False, max_context_tokens=2048)
    done = threading.Event()
    engine.submit(_req(proc, "runner", max_tokens=64), lambda ev: done.set() if ev.finished else None)
    good = image_input(proc, draw_image(1))
    stop = threading.Event()

    def client(k: int) -> None:
        for i in range(100_000):
            if stop.is_set():
                return
            ended = threading.Event()
            req = GenerationRequest(f"c{k}-{i}", [user("x" * 12000)], [good], SamplingParams(max_tokens=4))
            engine.submit(req, lambda ev, ended=ended: ended.set() if ev.finished else None)
            ended.wait(10)

    clients = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in clients:
        t.start()
    try:
        assert done.wait(30), "the running sequence never finished while prompts kept arriving"
    finally:
        stop.set()
        for t in clients:
            t.join()
    assert engine.stats().finished.get("rejected", 0) > 0


def test_a_submission_racing_stop_is_refused_or_finished(bundled, make_engine):
    """stop() while submissions are being accepted: each one is refused or ends with an event;
    none is left in flight."""
    model, proc = bundled
    for delay in (0.0, 0.01, 0.02):
        engine = make_engine(model, proc, prewarm=False)
        ids = [f"{delay}-{k}-{i}" for k in range(3) for i in range(40)]
        ended, refused = _submit_while_stopping(engine, [_req(proc, rid, max_tokens=2) for rid in ids], delay)
        assert sorted(ended + refused) == sorted(ids)
        assert engine.stats().waiting == 0 and not engine._known


def _submit_while_stopping(
    engine: Engine, requests: list[GenerationRequest], delay: float
) -> tuple[list[str], list[str]]:
    """Three threads submit ``requests`` while the engine stops after ``delay``: (ended, refused)."""
    ended: list[str] = []
    refused: list[str] = []

    def submitter(share: list[GenerationRequest]) -> None:
        for req in share:
            try:
                engine.submit(req, lambda ev: ended.append(ev.request_id) if ev.finished else None)
            except RequestRejected:
                refused.append(req.request_id)

    threads = [threading.Thread(target=submitter, args=(requests[k::3],)) for k in range(3)]
    for t in threads:
        t.start()
    time.sleep(delay)
    engine.stop(drain_timeout_s=0.05)
    for t in threads:
        t.join()
    return ended, refused


def test_the_engine_is_idle_only_while_no_request_is_in_flight(bundled, make_engine):
    """``idle`` tells the inference worker whether a request it submits is rendered at once (it then
    finishes the request's pictures beside the rendering, not before the hand-over)."""
    model, proc = bundled
    engine = make_engine(model, proc, max_batch=2)
    assert engine.idle()
    started, finished = threading.Event(), threading.Event()

    def on_event(ev: TokenEvent) -> None:
        started.set()
        if ev.finished:
            finished.set()

    engine.submit(_req(proc, "long", max_tokens=400), on_event)
    assert not engine.idle()  # submitted, not rendered yet
    assert started.wait(30)
    assert not engine.idle()  # running
    assert engine.cancel("long") and finished.wait(30)
    deadline = time.monotonic() + 5
    while not engine.idle() and time.monotonic() < deadline:  # a margin: the callback runs on its thread
        time.sleep(0.01)
    assert engine.idle()
