"""With tracing on (``shared.tracing``), FastAPI's own OpenTelemetry instrumentation makes a server
span per HTTP request and WebSocket connection, its parent the client's W3C ``traceparent`` (or
none: a new trace); a job submitted in it gets a ``vlmq.submit`` span whose context the job carries
to the workers. This middleware hands the client the request's ``traceparent`` in every response,
so one that sent none can find its trace. Pure ASGI: streams stay streams.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared import tracing


class TraceparentHeader:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_traceparent(message: Message) -> None:
            if message["type"] == "http.response.start" and (parent := tracing.current_traceparent()):
                message["headers"] = [*message.get("headers", []), (b"traceparent", parent.encode())]
            await send(message)

        await self.app(scope, receive, with_traceparent)
