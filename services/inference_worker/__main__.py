"""Inference worker process: ``python -m services.inference_worker``.

A long-running process (never a forked Celery child: CUDA does not survive fork) that loads
the engine, prewarms its prefix cache and serves the inference stream until SIGTERM/SIGINT
(exit 0), or until its engine turns unhealthy (``max_failed_steps`` failed steps in a row or a
device error): it then releases its in-flight jobs to other workers and exits with
``EXIT_ENGINE_UNHEALTHY`` so that its supervisor restarts it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from types import FrameType

from services.engine import Engine
from services.inference_worker.engine_setup import attach_pixel_table, engine_config, pixel_processor
from services.inference_worker.loop import InferenceWorker
from services.inference_worker.warmup import warm_up
from shared import log_context, tracing
from shared.config import get_inference_settings
from shared.heap import freeze_startup_heap
from shared.redis_clients import sync_client

log = logging.getLogger("services.inference_worker")
EXIT_ENGINE_UNHEALTHY = 75  # sysexits EX_TEMPFAIL: a restart is the remedy


def install_signals(worker: InferenceWorker) -> None:
    def handler(signum: int, _frame: FrameType | None) -> None:
        if worker.stopping.is_set():  # second signal: stop waiting for in-flight jobs
            worker.settings.drain_timeout_s = 0.0
        log.info("signal %d: stopping (in-flight jobs finish first)", signum)
        worker.stopping.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def set_torch_threads(configured: int) -> int:
    """Intra-op threads for the engine's forwards (one forward at a time: no inter-op pool needed)."""
    import torch

    threads = configured or int(os.environ.get("OMP_NUM_THREADS") or 0) or max(1, (os.cpu_count() or 2) // 2)
    torch.set_num_threads(threads)
    with contextlib.suppress(RuntimeError):  # only possible before any parallel work started
        torch.set_num_interop_threads(1)
    return threads


def main() -> int:
    settings = get_inference_settings()
    sys.setswitchinterval(settings.gil_switch_interval_s)
    log_context.configure(settings.log_level)
    tracing.setup("inference", settings.otlp_endpoint)
    set_torch_threads(settings.torch_threads)
    client = sync_client(settings.redis_url, sentinel=settings.sentinel)
    engine = Engine.from_pretrained(engine_config(settings))
    pixels = pixel_processor(engine, settings.model)
    attach_pixel_table(pixels, settings)
    worker = InferenceWorker(settings, engine, client, pixels)
    install_signals(worker)
    engine.start()
    engine.prewarm()
    warm_up(engine, pixels, settings.warmup_requests)
    # before the first job: its full collections no longer walk the ~425k startup objects (~190 ms)
    freeze_startup_heap("inference worker", settings.gc_freeze)
    worker.run()
    return 0 if engine.healthy else EXIT_ENGINE_UNHEALTHY


if __name__ == "__main__":
    sys.exit(main())
