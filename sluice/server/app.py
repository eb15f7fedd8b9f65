"""The FastAPI application: routes, error handlers, lifecycle.

Request path: validate (pydantic) → tenant (auth) → model and limits → runtime admission
(429/503 at once) → await the terminal event (or stream tokens as SSE). A client that
disconnects cancels its request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from sluice.backends.base import Backend
from sluice.backends.registry import make_backends
from sluice.config import Config, TenantConfig
from sluice.engine.runtime import Runtime
from sluice.server import errors
from sluice.server.auth import Auth
from sluice.server.errors import APIError
from sluice.server.metrics import PrometheusObserver, SnapshotCollector
from sluice.server.middleware import GuardMiddleware
from sluice.server.quota import QuotaCollector, QuotaGate
from sluice.server.routes import admin_router, api_router
from sluice.server.status import STATUS_PAGE, status_json

log = logging.getLogger("sluice.server")


@dataclass
class AppContext:
    """What every route needs; stored on ``app.state.ctx``."""

    config: Config
    runtime: Runtime
    auth: Auth
    registry: CollectorRegistry
    quota: QuotaGate
    preloaded: bool = False
    """The default model loaded at start-up (``/ready`` turns 200)."""


def create_app(config: Config, backends: Mapping[str, Backend] | None = None) -> FastAPI:
    """Build the app and its runtime; the runtime starts and stops with the app."""
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry)
    if backends is None:
        backends = make_backends(m.backend for m in config.models)
    runtime = Runtime(config.runtime_config(), backends, observer=observer)
    registry.register(SnapshotCollector(runtime.snapshot))
    quota = QuotaGate(config.quota, config.tenants, observer)
    registry.register(QuotaCollector(quota))
    ctx = AppContext(
        config=config,
        runtime=runtime,
        auth=Auth(config.tenants, config.server.admin_key),
        registry=registry,
        quota=quota,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime.start()
        for spec in runtime.specs.values():
            if spec.kind == "generative":
                try:  # a bad model file must not keep the other models from serving
                    await asyncio.to_thread(runtime.tokenizer, spec.model_id)
                except Exception as exc:
                    log.error("model %s: tokenizer failed to load: %s", spec.model_id, exc)
        try:  # load the default model now, so /ready means "can serve it"
            await asyncio.to_thread(runtime.call_on_workers, config.default_model, "load")
            ctx.preloaded = True
        except Exception as exc:
            log.error("default model %s failed to load: %s", config.default_model, exc)
        log.info("sluice ready: %d model(s), %d worker(s)", len(runtime.specs),
                 len(runtime.workers))
        try:
            yield
        finally:
            cancelled = await asyncio.to_thread(runtime.stop, config.server.drain_timeout_s)
            log.info("sluice stopped; %d request(s) cancelled at shutdown", cancelled)
            await quota.aclose()

    app = FastAPI(title="sluice", version="0.1.0", lifespan=lifespan,
                  summary="An adaptive inference server")
    app.state.ctx = ctx
    app.add_middleware(GuardMiddleware, max_body_bytes=config.server.max_body_bytes)
    app.add_exception_handler(APIError, errors.api_error_handler)
    app.add_exception_handler(RequestValidationError, errors.validation_error_handler)
    app.add_exception_handler(StarletteHTTPException, errors.http_error_handler)
    app.add_exception_handler(Exception, errors.unhandled_error_handler)
    app.include_router(api_router)
    app.include_router(admin_router)

    @app.get("/health", tags=["operations"])
    async def health() -> dict[str, str]:
        """The process is alive."""
        return {"status": "ok"}

    @app.get("/ready", tags=["operations"], responses={503: {"description": "not ready"}})
    async def ready() -> JSONResponse:
        """Able to serve the default model: loaded on a worker (or loadable again after an
        eviction), and not draining."""
        model = config.default_model
        if runtime.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        snap = runtime.snapshot()
        resident = any(model in w.resident for w in snap.workers)
        if not resident and any(model in w.failed_models for w in snap.workers):
            return JSONResponse({"status": "failed", "model": model}, status_code=503)
        if not (resident or ctx.preloaded):
            return JSONResponse({"status": "loading", "model": model}, status_code=503)
        return JSONResponse({"status": "ready", "model": model})

    @app.get("/metrics", tags=["operations"], response_class=Response)
    async def metrics() -> Response:
        """Prometheus text exposition."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/status", tags=["operations"], response_class=HTMLResponse)
    async def status_page() -> HTMLResponse:
        """A live page: queue, workers, resident models, batches."""
        return HTMLResponse(STATUS_PAGE)

    @app.get("/status.json", tags=["operations"])
    async def status_data() -> dict[str, Any]:
        """The numbers behind the status page."""
        return status_json(runtime)

    return app


def tenant_of(request: Request) -> TenantConfig:
    ctx: AppContext = request.app.state.ctx
    return ctx.auth.tenant(request)
