"""Inference worker process: ``python -m services.inference_worker``.

A long-running process (never a forked Celery child: CUDA does not survive fork) that loads
the engine, prewarms its prefix cache and serves the inference stream until SIGTERM/SIGINT.
The Redis side lives in ``services.adapter``; the engine does the rest.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
from types import FrameType
from typing import Any

import redis

from services.adapter.runner import InferenceWorker
from services.engine import Engine, EngineConfig
from services.vlm.image_processor import processor_id
from shared.config import InferenceSettings, get_inference_settings

log = logging.getLogger("services.inference_worker")


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def engine_config(settings: InferenceSettings, config_cls: Any = EngineConfig) -> EngineConfig:
    """EngineConfig from settings; a setting EngineConfig lacks is an error, never silently dropped."""
    mb = 1024 * 1024
    values: dict[str, Any] = {
        "model_path": settings.model,
        "quantize": settings.quantize,
        "device": resolve_device(settings.device),
        "max_batch": settings.max_batch,
        "batch_window_ms": settings.batch_window_ms,
        "max_context_tokens": settings.max_context_tokens,
        "max_new_tokens_limit": settings.max_tokens_limit,
        "prefix_cache": settings.prefix_cache,
        "session_cache": settings.session_cache,
        "image_cache": settings.image_cache,
        "prefix_cache_bytes": settings.prefix_cache_mb * mb,
        "session_cache_bytes": settings.session_cache_mb * mb,
        "image_cache_bytes": settings.image_cache_mb * mb,
        "session_ttl_s": settings.session_ttl_s,
    }
    unknown = sorted(set(values) - {f.name for f in dataclasses.fields(config_cls)})
    if unknown:
        raise ValueError(f"{config_cls.__name__} has no field(s) {unknown}: settings and engine disagree")
    config: EngineConfig = config_cls(**values)
    return config


def image_processor(engine: Engine, model_path: str) -> object:
    """The engine's image processor: its config id names the tensors the decode workers wrote."""
    found = getattr(engine, "image_processor", None)
    if found is not None:
        return found
    from services.vlm.loading import load_image_processor

    return load_image_processor(model_path)


def install_signals(worker: InferenceWorker) -> None:
    def handler(signum: int, _frame: FrameType | None) -> None:
        if worker.stopping.is_set():  # second signal: stop waiting for in-flight jobs
            worker.settings.drain_timeout_s = 0.0
        log.info("signal %d: stopping (in-flight jobs finish first)", signum)
        worker.stopping.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


# Python's GIL switch interval (5 ms by default) for this process. Four threads share the GIL
# here: the engine's decode loop, vision prefetch, the event writer and the stream reader. A
# thread woken by I/O (a token to write, a job to read) waits up to one interval while the engine
# thread runs Python between torch ops: each token event reached Redis up to 5 ms late.
GIL_SWITCH_INTERVAL_S = float(os.environ.get("VLMQ_GIL_SWITCH_INTERVAL_S", "0.0005"))


def main() -> int:
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    settings = get_inference_settings()
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    client = redis.Redis.from_url(settings.redis_url, socket_timeout=10, health_check_interval=30)
    engine = Engine.from_pretrained(engine_config(settings))
    worker = InferenceWorker(settings, engine, client, processor_id(image_processor(engine, settings.model)))
    install_signals(worker)
    engine.start()
    engine.prewarm()
    worker.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
