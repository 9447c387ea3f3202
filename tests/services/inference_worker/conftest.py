"""Decode worker + inference worker (real processes) on the random-init checkpoint.

The random-init model never emits EOS, so every job runs exactly ``max_tokens`` steps: long,
deterministic generations for cancel, kill and drain tests whatever the trained model answers.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from services.engine import Engine, EngineConfig
from tests.support.models import random_model_path
from tests.support.stack import ServiceStack, running

STACK_ENV = {
    "VLMQ_MODEL": str(random_model_path()),
    "VLMQ_CLAIM_IDLE_MS": "1500",
    "VLMQ_DRAIN_TIMEOUT_S": "20",
    # the engine finishes the uint8 pictures itself, as on a GPU (the default on the CPU, which every
    # other suite runs, is the processor's steps after the hand-over: ``ProcessorPixels``): the
    # answers must not change
    "VLMQ_PIXELS_ON_DEVICE": "true",
}


@pytest.fixture(scope="module")
def inference_stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceStack]:
    stack = ServiceStack(
        redis_url,
        tmp_path_factory.mktemp("inference-logs"),
        extra_env=STACK_ENV,
        components=("decode", "inference"),
    )
    with running(stack):
        yield stack


@pytest.fixture(scope="module")
def reference_engine() -> Iterator[Engine]:
    """The same checkpoint in-process: what a batch-of-one, cache-free run produces."""
    engine = Engine.from_pretrained(
        EngineConfig(
            model_path=str(random_model_path()),
            device="cpu",
            prefix_cache=False,
            session_cache=False,
            image_cache=False,
        )
    )
    engine.start()
    yield engine
    engine.stop()
