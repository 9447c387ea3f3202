"""Faults stay as small as they are: a numerical error fails its own sequence, a failed step fails the
sequences in it, and only ``max_failed_steps`` failed steps in a row or a device error make the
engine unhealthy (it then runs nothing more; its worker exits and is restarted)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
import torch

from bench.common import draw_image, image_input
from services.engine import FinishReason, GenerationRequest, SamplingParams, TokenEvent
from tests.services.engine.reference import check, run_all, tokens_of, user


def _req(proc: Any, rid: str, image: int = 1, **sampling: Any) -> GenerationRequest:
    sampling.setdefault("max_tokens", 8)
    return GenerationRequest(
        rid,
        [user("What colour is the circle?")],
        [image_input(proc, draw_image(image))],
        SamplingParams(**sampling),
    )


class ForwardFaults:
    """A pre-hook on the first decoder layer: the next ``n`` forwards for which ``when()`` holds raise
    ``error``."""

    def __init__(self, model: Any, error: Exception, when: Callable[[], bool] = lambda: True) -> None:
        self.error = error
        self.when = when
        self.left = 0
        self._handle = model.get_decoder().layers[0].register_forward_pre_hook(self._hook)

    def fail_next(self, n: int = 1) -> ForwardFaults:
        self.left = n
        return self

    def _hook(self, *_: Any) -> None:
        if self.left > 0 and self.when():
            self.left -= 1
            raise self.error

    def remove(self) -> None:
        self._handle.remove()


@pytest.fixture
def faults() -> Iterator[Callable[..., ForwardFaults]]:
    made: list[ForwardFaults] = []

    def make(model: Any, error: Exception, when: Callable[[], bool] = lambda: True) -> ForwardFaults:
        made.append(ForwardFaults(model, error, when))
        return made[-1]

    yield make
    for f in made:
        f.remove()


def test_a_tiny_temperature_gives_the_greedy_answer(bundled, make_engine):
    """Regression: temperature=1e-320 made the logits inf and marked the engine unhealthy for good."""
    model, proc = bundled
    engine = make_engine(model, proc)
    greedy = engine.generate_sync(_req(proc, "greedy", max_tokens=12, ignore_eos=True))
    for i, t in enumerate((1e-320, 1e-38, 5e-6)):
        ev = engine.generate_sync(
            _req(proc, f"tiny{i}", max_tokens=12, ignore_eos=True, temperature=t, seed=7)
        )
        assert tokens_of(ev) == tokens_of(greedy) and ev[-1].finish_reason == FinishReason.LENGTH
    assert engine.healthy and engine.stats().errors == 0


def test_nan_in_one_row_fails_that_request_only(bundled, make_engine, bundled_tie_tol):
    """NaN injected into one batch row's hidden state at a decode step: that request fails with the
    cause; the rows decoded with it are token-identical to uncached batch-of-one runs."""
    model, proc = bundled
    engine = make_engine(model, proc)
    good = [_req(proc, f"ok{i}", image=60 + i, max_tokens=12, ignore_eos=True) for i in range(3)]
    poison = _req(proc, "poison", image=64, max_tokens=12, ignore_eos=True)
    decodes = 0

    def hook(_m: Any, _args: Any, out: Any) -> None:
        nonlocal decodes
        hidden, ids = out[0] if isinstance(out, tuple) else out, engine.runner.batch.ids
        if hidden.shape[1] == 1 and len(ids) == 4:  # a decode step of all four rows
            decodes += 1
            if decodes == 2:
                hidden[ids.index("poison")] = float("nan")

    handle = model.get_decoder().layers[0].register_forward_hook(hook)
    try:
        out = run_all(engine, [*good, poison])
    finally:
        handle.remove()
    last = out["poison"][-1]
    assert last.finish_reason == FinishReason.ERROR
    assert "non-finite logits from the model (NaN)" in (last.error or "")
    for r in good:
        alone = engine.generate_sync(replace(r, request_id=f"{r.request_id}-alone", use_cache=False))
        assert tokens_of(out[r.request_id]) == tokens_of(alone) and len(tokens_of(alone)) == 12
        check(out[r.request_id], model, proc, r, [draw_image(int(r.request_id[2:]) + 60)], bundled_tie_tol)
    s = engine.stats()
    assert engine.healthy and s.errors == 1 and s.failed_steps == 0 and s.finished["error"] == 1


def test_failed_steps_make_the_engine_unhealthy_only_k_in_a_row(tiny_models, make_engine, faults):
    model, proc = tiny_models["glm4v"]
    engine = make_engine(model, proc, max_failed_steps=3)
    fault = faults(model, RuntimeError("forward fault"))

    def run(rid: str, failing: bool) -> list[TokenEvent]:
        fault.fail_next(1 if failing else 0)  # a lone request: its prefill is the step's only forward
        return engine.generate_sync(_req(proc, rid), timeout_s=30)

    for i in range(2):
        assert run(f"f{i}", failing=True)[-1].finish_reason == FinishReason.ERROR
    assert engine.healthy and engine.stats().failed_steps == 2
    assert run("ok", failing=False)[-1].finish_reason in (FinishReason.LENGTH, FinishReason.STOP)
    assert engine.stats().failed_steps == 0  # a step that ran resets the count
    for i in range(2):
        run(f"g{i}", failing=True)
    assert engine.healthy  # K-1 in a row (4 failures in all)
    last = run("g2", failing=True)[-1]
    assert last.finish_reason == FinishReason.ERROR and "forward fault" in (last.error or "")
    assert not engine.healthy and engine.stats().failed_steps == 3
    assert "3 engine steps failed in a row" in (engine.last_error or "")
    _assert_runs_nothing_more(engine, proc)


def _assert_runs_nothing_more(engine: Any, proc: Any) -> None:
    """Unhealthy: a request submitted now is never run; cancel (here generate_sync's timeout) ends it."""
    steps = engine.stats().steps
    late = engine.generate_sync(_req(proc, "late"), timeout_s=0.5)
    assert [e.finish_reason for e in late] == [FinishReason.CANCELLED] and engine.stats().steps == steps


@pytest.mark.parametrize(
    "error, unhealthy",
    [
        (RuntimeError("CUDA error: device-side assert triggered"), True),
        (torch.AcceleratorError("CUDA error: an illegal memory access was encountered"), True),
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), False),
    ],
)
def test_a_device_error_is_unhealthy_at_once_out_of_memory_is_not(
    tiny_models, make_engine, faults, error, unhealthy
):
    """Two rows decode, a third waits (batch of 2); their first decode step raises ``error``."""
    model, proc = tiny_models["glm4v"]
    engine = make_engine(model, proc, max_batch=2, batch_window_ms=0, max_failed_steps=3)
    fault = faults(model, error, when=lambda: len(engine.runner.batch.ids) == 2).fail_next(1)
    events: dict[str, list[TokenEvent]] = {"a": [], "b": [], "c": []}
    finished = threading.Semaphore(0)

    def on_event(ev: TokenEvent) -> None:
        events[ev.request_id].append(ev)
        if ev.finished:
            finished.release()

    for rid in "abc":
        engine.submit(_req(proc, rid, max_tokens=40, ignore_eos=True), on_event)
    assert finished.acquire(timeout=30) and finished.acquire(timeout=30)
    for rid in "ab":
        last = events[rid][-1]
        assert last.finish_reason == FinishReason.ERROR and str(error) in (last.error or "")
    assert fault.left == 0 and engine.healthy is not unhealthy
    if unhealthy:
        assert (engine.last_error or "").startswith("device error:") and not events["c"]
        engine.stop()  # an unhealthy engine cancels what it holds at once (its worker releases it)
        assert [e.finish_reason for e in events["c"]] == [FinishReason.CANCELLED]
    else:
        assert finished.acquire(timeout=30) and events["c"][-1].finish_reason == FinishReason.LENGTH
