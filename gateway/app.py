"""The gateway application: ``python -m uvicorn gateway.app:create_app --factory``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from starlette.applications import Starlette
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.batch_driver import BatchDriver
from gateway.body_limit import BodyLimitMiddleware, body_limit
from gateway.errors import install_error_handlers
from gateway.guards import Guard
from gateway.json_response import FastJSONResponse
from gateway.routes import (
    batches,
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
from gateway.routes.health import render_metrics
from gateway.state import GatewayState
from gateway.tracing import TraceparentHeader
from shared import log_context, tracing
from shared.config import GatewaySettings, get_gateway_settings


def create_app(settings: GatewaySettings | None = None) -> FastAPI:
    settings = settings or get_gateway_settings()
    log_context.configure(settings.log_level)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = GatewayState.create(settings)
        app.state.gateway = state
        if not state.keyring.enabled:
            logging.getLogger("gateway").warning("no API key configured: the gateway is open to anyone")
        state.keyring.reload_on_sighup()
        driver = asyncio.create_task(BatchDriver(state).run())
        try:
            yield
        finally:
            driver.cancel()
            await asyncio.gather(driver, return_exceptions=True)
            await state.close()

    docs = settings.serve_docs
    app = FastAPI(
        title="vlmq gateway",
        version="0.1.0",
        lifespan=lifespan,
        default_response_class=FastJSONResponse,  # orjson: several times cheaper than json.dumps
        docs_url="/docs" if docs else None,
        redoc_url=None,
        openapi_url="/openapi.json" if docs else None,
    )
    install_error_handlers(app)
    larger = {"/v1/files": settings.max_batch_file_bytes + 64 * 1024}  # batch input files
    app.add_middleware(
        BodyLimitMiddleware,
        max_body=body_limit(settings.max_image_bytes, settings.max_images_per_request),
        larger=larger,
    )
    if settings.cors_origins:
        origins = [o.strip() for o in settings.cors_origins.split(",") if o.strip()]
        app.add_middleware(
            CORSMiddleware, allow_origins=origins, allow_methods=["*"], allow_headers=["*"], max_age=600
        )
    app.add_middleware(Guard, allowed_hosts=settings.allowed_hosts, cors_origins=settings.cors_origins)
    if tracing.setup("gateway", settings.otlp_endpoint):
        app.add_middleware(TraceparentHeader)  # FastAPI itself makes the request spans
    routers = (jobs, job_streams, conversations, chat_ws, openai, batches, dead_letters, status, health, web)
    for module in routers:
        if module is not job_streams:  # an event stream has no whole response to describe
            answer_head(module.router)
        app.include_router(module.router)
    web.mount_files(app)
    return app


def answer_head(router: APIRouter) -> None:
    """HEAD wherever GET answers (RFC 9110 9.3.2; uptime checks and load balancers send it):
    Starlette's own routes do so, FastAPI's do not. The server sends the headers, no body."""
    gets = [r for r in router.routes if isinstance(r, APIRoute) and r.methods and "GET" in r.methods]
    for route in gets:  # a route of its own: one operation id a GET in the OpenAPI schema
        path = route.path.removeprefix(router.prefix)
        router.add_api_route(path, route.endpoint, methods=["HEAD"], include_in_schema=False)


def create_metrics_app(main: FastAPI) -> Starlette:
    """The ``VLMQ_METRICS_PORT`` listener: ``/metrics`` of ``main``'s state, with no key (for
    Prometheus inside the cluster; compose and k8s never publish this port)."""

    async def metrics(_request: Request) -> Response:
        return await render_metrics(main.state.gateway)

    return Starlette(routes=[Route("/metrics", metrics)])
