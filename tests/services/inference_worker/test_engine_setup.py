"""Settings -> EngineConfig: every setting reaches the engine, or the worker refuses to start."""

from __future__ import annotations

import dataclasses

import pytest

from services.inference_worker.engine_setup import engine_config
from shared.config import InferenceSettings


def settings() -> InferenceSettings:
    return InferenceSettings(  # type: ignore[call-arg]
        _env_file=None, device="cpu", quantize="int8", session_cache_mb=3, max_failed_steps=5
    )


def test_every_setting_reaches_the_engine() -> None:
    config = engine_config(settings())
    assert config.quantize == "int8" and config.session_cache_bytes == 3 * 1024 * 1024
    assert config.max_failed_steps == 5


def test_a_setting_the_engine_lacks_is_an_error_not_a_silent_drop() -> None:
    @dataclasses.dataclass(frozen=True)
    class OlderEngineConfig:  # an engine version without the session cache
        model_path: str = ""
        quantize: str = "none"
        device: str = "cpu"

    with pytest.raises(ValueError, match="session_cache"):
        engine_config(settings(), OlderEngineConfig)
