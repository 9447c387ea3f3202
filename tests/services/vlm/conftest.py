"""The committed vlmq-tiny checkpoint, loaded once per session in each quantization mode."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import services  # noqa: F401  (registers the processor, as every client does)
from services.vlm.loading import load_model

ROOT = Path(__file__).resolve().parents[3]
MODEL_DIR = ROOT / "models" / "vlmq-tiny"
EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="session")
def model_dir() -> Path:
    if not (MODEL_DIR / "config.json").exists():
        pytest.fail(f"{MODEL_DIR} missing: the trained checkpoint is committed with the repository")
    return MODEL_DIR


@pytest.fixture(scope="session")
def loaded(model_dir: Path) -> Callable[[str], tuple[Any, Any]]:
    cache: dict[str, tuple[Any, Any]] = {}

    def get(mode: str = "none") -> tuple[Any, Any]:
        if mode not in cache:
            cache[mode] = load_model(model_dir, quantize=mode)
        return cache[mode]

    return get
