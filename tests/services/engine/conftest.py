"""Engine test fixtures: the bundled model (models/vlmq-tiny, or the random-init checkpoint in the
final format until it lands) and tiny random models of three architectures."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from bench.common import build_model, bundled_is_random, load_bundled
from services.engine import Engine, EngineConfig
from services.engine.caches import BoundedCache

torch.set_num_threads(2)


@pytest.fixture(autouse=True, scope="session")
def cache_checksums() -> Iterator[None]:
    """Every cache put records a checksum here, so ``check_integrity`` proves stored tensors unchanged."""
    BoundedCache.record_checksums = True
    yield
    BoundedCache.record_checksums = False


@pytest.fixture(scope="session")
def bundled() -> tuple[Any, Any]:
    return load_bundled()  # models/vlmq-tiny is committed: a missing checkpoint is a failure


@pytest.fixture(scope="session")
def bundled_tie_tol() -> float:
    """Trained weights: strictly token-identical. Random-init stand-in: near ties allowed."""
    return 1e-4 if bundled_is_random() else 0.0


@pytest.fixture(scope="session")
def tiny_models() -> dict[str, tuple[Any, Any]]:
    return {name: build_model(name) for name in ("glm4v", "qwen2_vl", "llava")}


@pytest.fixture
def make_engine() -> Iterator[Callable[..., Engine]]:
    engines: list[Engine] = []

    def make(model: Any, processor: Any, prewarm: bool = True, **cfg: Any) -> Engine:
        cfg.setdefault("max_batch", 8)
        engine = Engine(model, processor, EngineConfig(**cfg))
        if prewarm:
            engine.prewarm()
        engine.start()
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.stop(drain_timeout_s=5)
