"""Request-body cap, enforced while the body streams in (declared or chunked).

Why an ASGI wrapper: Starlette spools multipart files to disk before a route sees them,
so an oversized upload must be refused on the way in, not after it has been stored.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import APIError, error_body


def body_limit(max_image_bytes: int, max_images: int = 1) -> int:
    """Largest body: ``max_images`` base64 images (4/3 of the bytes) plus prompt and form overhead."""
    return max_images * max_image_bytes * 4 // 3 + 256 * 1024


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_body: int, larger: dict[str, int] | None = None) -> None:
        self.app = app
        self.default_max = max_body
        self.larger = larger or {}  # path -> its own cap (batch input files)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        max_body = self.larger.get(scope["path"], self.default_max)
        declared = _content_length(scope)
        if declared is not None and declared > max_body:
            await _reject(send, max_body)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > max_body:
                    raise APIError(413, _message(max_body), code="body_too_large")
            return message

        await self.app(scope, limited_receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _message(max_body: int) -> str:
    return f"request body too large (limit {max_body} bytes)"


async def _reject(send: Send, max_body: int) -> None:
    import json

    body = json.dumps(error_body(413, _message(max_body), code="body_too_large")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})
