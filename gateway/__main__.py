"""``python -m gateway``: the gateway under uvicorn, with the server settings it is meant to run with.

Same as ``python -m uvicorn gateway.app:create_app --factory --host H --port P`` plus
``--ws-per-message-deflate false`` (with plain ``uvicorn``, pass that flag or set
``UVICORN_WS_PER_MESSAGE_DEFLATE=false``): WebSocket clients send images as base64 data URLs,
which deflate barely shrinks, for milliseconds of CPU per message on both ends (an 84 KB
message took 5.3 ms from send to server receipt with deflate, 0.1 ms without). Host, port and
log level come from the gateway settings (``VLMQ_HOST``, ``VLMQ_PORT``, ``VLMQ_LOG_LEVEL``); with
``VLMQ_METRICS_PORT`` a second listener serves ``/metrics`` without a key. Only this entry point
freezes the startup heap out of the garbage collector (``shared.heap``, ``VLMQ_GC_FREEZE``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import uvicorn

from gateway.app import create_app, create_metrics_app
from shared.config import get_gateway_settings
from shared.heap import freeze_startup_heap


def main() -> None:
    settings = get_gateway_settings()
    app = create_app(settings)
    api = uvicorn.Server(_config(app, settings.host, settings.port, settings.log_level))
    freeze_startup_heap("gateway", settings.gc_freeze)  # the imports: not the app's requests
    if settings.metrics_port is None:
        api.run()
        return
    metrics = _QuietServer(_config(create_metrics_app(app), settings.host, settings.metrics_port, "warning"))
    asyncio.run(_serve(api, metrics))


def _config(app: Any, host: str, port: int, log_level: str) -> uvicorn.Config:
    # No uvicorn access log: the audit line (gateway/guards.py) names the same request and more.
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level.lower(),
        ws_per_message_deflate=False,
        access_log=False,
    )


class _QuietServer(uvicorn.Server):
    """The metrics listener leaves signals to the API server, and stops when it stops."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def _serve(api: uvicorn.Server, metrics: uvicorn.Server) -> None:
    listener = asyncio.create_task(metrics.serve())
    try:
        await api.serve()
    finally:
        metrics.should_exit = True
        await listener


if __name__ == "__main__":
    main()
