"""Is the server shutting down? Streams poll this between blocking reads so that SIGTERM
ends them in bounded time (uvicorn waits for open requests before it exits).

uvicorn exposes no hook to the app; sse-starlette sets ``AppStatus.should_exit`` from its
patched ``Server.handle_exit``, and the running server is reachable through its SIGTERM
handler (a bound method). Either one says so.
"""

from __future__ import annotations

import signal

from sse_starlette.sse import AppStatus


def server_exiting() -> bool:
    if AppStatus.should_exit:
        return True
    handler = signal.getsignal(signal.SIGTERM)
    server = getattr(handler, "__self__", None)
    return bool(getattr(server, "should_exit", False))
