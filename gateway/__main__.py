"""``python -m gateway``: the gateway under uvicorn, with the server settings it is meant to run with.

Same as ``python -m uvicorn gateway.app:create_app --factory --host H --port P`` plus
``--ws-per-message-deflate false`` (with plain ``uvicorn``, pass that flag or set
``UVICORN_WS_PER_MESSAGE_DEFLATE=false``): WebSocket clients send images as base64 data URLs,
which deflate barely shrinks, for milliseconds of CPU per message on both ends (an 84 KB
message took 5.3 ms from send to server receipt with deflate, 0.1 ms without). Host, port and
log level come from the gateway settings (``VLMQ_HOST``, ``VLMQ_PORT``, ``VLMQ_LOG_LEVEL``).
"""

from __future__ import annotations

import uvicorn

from shared.config import get_gateway_settings


def main() -> None:
    settings = get_gateway_settings()
    uvicorn.run(
        "gateway.app:create_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        ws_per_message_deflate=False,
    )


if __name__ == "__main__":
    main()
