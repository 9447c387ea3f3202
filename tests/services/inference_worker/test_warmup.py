"""The worker's warm-up: dummy requests through the real engine (bundled model) before it takes jobs,
leaving no trace in the caches or the counters, and no effect on the answers that follow."""

from __future__ import annotations

import pytest

from bench.common import BUNDLED_MODEL, draw_image, image_input, load_bundled
from services.engine import Engine, EngineConfig, GenerationRequest, SamplingParams
from services.inference_worker.engine_setup import pixel_processor
from services.inference_worker.warmup import warm_up, warmup_requests
from tests.services.engine.reference import tokens_of, user


def _engine() -> Engine:
    model, processor = load_bundled()
    engine = Engine(model, processor, EngineConfig(max_batch=4))
    engine.prewarm()
    engine.start()
    return engine


def _answer(engine: Engine) -> list[int]:
    picture = image_input(engine.processor, draw_image(3))
    request = GenerationRequest("real", [user("What colour is the circle?")], [picture], SamplingParams(8))
    return tokens_of(engine.generate_sync(request, 60))


def test_warm_up_runs_dummies_then_forgets_them() -> None:
    cold, warm = _engine(), _engine()
    try:
        before = {name: (c.entries, c.hits) for name, c in warm.stats().caches.items()}
        assert warm_up(warm, pixel_processor(warm, str(BUNDLED_MODEL)), 3) > 0
        stats = warm.stats()
        assert stats.submitted == 0 and stats.steps == 0 and stats.generated_tokens == 0
        assert {name: (c.entries, c.hits) for name, c in stats.caches.items()} == before  # caches bypassed
        assert _answer(warm) == _answer(cold)  # the warm-up changes nothing that follows
        assert warm.stats().submitted == 1
    finally:
        cold.stop()
        warm.stop()


def test_warmup_requests_differ_in_length_and_carry_the_picture() -> None:
    engine = _engine()
    try:
        requests = warmup_requests(engine, pixel_processor(engine, str(BUNDLED_MODEL)), 3)
        prompts = {len(engine.prompts.build(r).token_ids) for r in requests}
        assert len(prompts) == 3 and all(len(r.images) == 1 and not r.use_cache for r in requests)
        assert (
            warm_up(engine, pixel_processor(engine, str(BUNDLED_MODEL)), 0) == 0.0
            and engine.stats().submitted == 0
        )
    finally:
        engine.stop()


def test_a_failed_warm_up_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    engine = _engine()
    try:
        engine.stop(drain_timeout_s=5)  # a stopped engine refuses every request
        assert warm_up(engine, pixel_processor(engine, str(BUNDLED_MODEL)), 2) >= 0.0
        assert "warm-up failed" in caplog.text and engine.stats().submitted == 0
    finally:
        engine.stop()
