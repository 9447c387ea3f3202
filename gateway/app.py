"""The gateway application: ``python -m uvicorn gateway.app:create_app --factory``."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from gateway.body_limit import BodyLimitMiddleware, body_limit
from gateway.errors import install_error_handlers
from gateway.routes import (
    chat_ws,
    conversations,
    dead_letters,
    health,
    job_streams,
    jobs,
    openai,
    status,
    web,
)
from gateway.state import GatewayState
from shared.config import GatewaySettings, get_gateway_settings


def create_app(settings: GatewaySettings | None = None) -> FastAPI:
    settings = settings or get_gateway_settings()
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = GatewayState.create(settings)
        app.state.gateway = state
        try:
            yield
        finally:
            await state.close()

    app = FastAPI(title="vlmq gateway", version="0.1.0", lifespan=lifespan)
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_body=body_limit(settings.max_image_bytes))
    for module in (jobs, job_streams, conversations, chat_ws, openai, dead_letters, status, health, web):
        app.include_router(module.router)
    return app
