"""The FastAPI application: context, middleware, error handlers, routers, lifecycle.

Request path: validate (pydantic) → tenant (auth) → model and limits → runtime admission
(429/503 at once) → await the terminal event (or stream tokens as SSE). A client that
disconnects cancels its request. The routes live in ``sluice.server.routes``, one module per
surface; what they share is the ``AppContext`` (``sluice.server.context``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from prometheus_client import CollectorRegistry
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import PlainTextResponse, Response
from starlette.types import Message, Receive, Scope, Send

from sluice.backends.base import Backend
from sluice.backends.registry import make_backends
from sluice.config import Config
from sluice.engine.constraints import warm_vocabulary
from sluice.engine.observer import Observers
from sluice.engine.runtime import Runtime
from sluice.server import errors
from sluice.server.auth import Auth, startup_warnings
from sluice.server.context import AppContext
from sluice.server.decisions import DecisionLog
from sluice.server.errors import APIError
from sluice.server.metrics import PrometheusObserver, SnapshotCollector, tenant_labels
from sluice.server.middleware import AccessLogMiddleware, GuardMiddleware, QuotaPeekMiddleware
from sluice.server.peer_metrics import PeerMetricsCollector
from sluice.server.quota import QuotaCollector, QuotaGate
from sluice.server.routes import ROUTERS
from sluice.server.sampler import read_metrics, sample_forever

log = logging.getLogger("sluice.server")


def create_app(config: Config, backends: Mapping[str, Backend] | None = None) -> FastAPI:
    """Build the app and its runtime; the runtime starts and stops with the app.
    ``ValueError`` names a setting that cannot be served (a key file, the slot folder)."""
    config.server.slot_folder()
    registry = CollectorRegistry()
    prometheus = PrometheusObserver(registry, tenant_labels(t.id for t in config.tenants),
                                    generative=[m.id for m in config.models
                                                if m.kind == "generative"])
    decisions = DecisionLog()
    observer = Observers(prometheus, decisions)
    if backends is None:
        backends = make_backends(m.backend for m in config.models)
    runtime = Runtime(config.runtime_config(), backends, observer=observer)
    registry.register(SnapshotCollector(runtime.snapshot))
    registry.register(PeerMetricsCollector(runtime.snapshot, prometheus.llama,
                                           config.engine.kv_block_tokens))
    quota = QuotaGate(config.quota, config.tenants, observer)
    registry.register(QuotaCollector(quota))
    ctx = AppContext(
        config=config,
        runtime=runtime,
        auth=Auth(config.tenants, config.server.admin_key_value(),
                  open_admin=config.server.open_admin,
                  metrics_key=config.server.metrics_key,
                  open_metrics=config.server.open_metrics,
                  require_keys=config.server.require_keys),
        registry=registry,
        quota=quota,
        decisions=decisions,
    )

    for warning in startup_warnings(config.tenants, ctx.auth):
        log.warning("%s", warning)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime.start()
        for spec in runtime.specs.values():
            if spec.kind == "generative":
                try:  # a bad model file must not keep the other models from serving
                    await asyncio.to_thread(_warm_tokenizer, runtime, spec.model_id)
                except Exception as exc:
                    log.error("model %s: tokenizer failed to load: %s", spec.model_id, exc)
        try:  # load the default model now, so /ready means "can serve it"
            await asyncio.to_thread(runtime.call_on_workers, config.default_model, "load")
            ctx.preloaded = True
        except Exception as exc:
            log.error("default model %s failed to load: %s", config.default_model, exc)
            ctx.load_error = errors.public_text(str(exc))
        grpc_server = await _start_grpc(ctx)
        log.info("sluice ready: %d model(s), %d worker(s)", len(runtime.specs),
                 len(runtime.workers))
        sampler = asyncio.create_task(sample_forever(
            ctx.history, lambda: read_metrics(prometheus, runtime.snapshot(), runtime.clock())))
        try:
            yield
        finally:
            sampler.cancel()
            drain_s = config.server.drain_timeout_s
            stopping = asyncio.to_thread(runtime.stop, drain_s)
            if grpc_server is not None:
                # gRPC calls in flight end with their requests, which runtime.stop ends at
                # the drain timeout; both run together, so the drain takes one timeout.
                runtime.begin_drain()
                _, cancelled = await asyncio.gather(grpc_server.stop(drain_s), stopping)
            else:
                cancelled = await stopping
            log.info("sluice stopped; %d request(s) cancelled at shutdown", cancelled)
            await quota.aclose()

    schema = config.server.openapi  # off by default: the schema lists the admin routes
    app = FastAPI(title="sluice", version="0.1.0", lifespan=lifespan,
                  summary="An adaptive inference server",
                  openapi_url="/openapi.json" if schema else None,
                  docs_url="/docs" if schema else None, redoc_url="/redoc" if schema else None)
    app.state.ctx = ctx
    # Added before the guard, so inside it: the size limit first, then the quota's peek.
    app.add_middleware(QuotaPeekMiddleware)
    app.add_middleware(GuardMiddleware, max_body_bytes=config.server.max_body_bytes,
                       body_timeout_s=config.server.body_timeout_s)
    if config.server.cors_origins:  # off unless configured: browsers then refuse other origins
        origins = [o for o in config.server.cors_origins if o != LOCALHOST_ORIGINS]
        app.add_middleware(LlamaCors, allow_origins=origins,
                           allow_origin_regex=(LOCALHOST_ORIGIN_RE if LOCALHOST_ORIGINS
                                               in config.server.cors_origins else None),
                           allow_methods=["*"], allow_headers=["*"],
                           expose_headers=["x-sluice-request-id", "retry-after"])
    # Added last, so outermost: it logs every answer, the guard's 413s included.
    app.add_middleware(AccessLogMiddleware, log_content=config.server.log_content)
    app.add_exception_handler(APIError, errors.api_error_handler)
    app.add_exception_handler(RequestValidationError, errors.validation_error_handler)
    app.add_exception_handler(StarletteHTTPException, errors.http_error_handler)
    app.add_exception_handler(Exception, errors.unhandled_error_handler)
    for router in ROUTERS:
        app.include_router(router)
    return app


class LlamaCors(CORSMiddleware):
    """Starlette's CORS, but a preflight from an origin that is not allowed is answered 200
    without CORS headers, as llama-server answers it, not 400: the browser refuses the call
    either way; and the CORS headers' names in llama-server's letter case
    (``Access-Control-Allow-Origin``), which clients that read headers case-sensitively
    (llama.cpp's own test suite) look for."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def cased(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [(_cors_case(k), v) for k, v in message["headers"]]
            await send(message)

        await super().__call__(scope, receive, cased)

    def preflight_response(self, request_headers: Headers) -> Response:
        if not self.is_allowed_origin(origin=request_headers["origin"]):
            return PlainTextResponse("", status_code=200)
        return super().preflight_response(request_headers)


def _cors_case(name: bytes) -> bytes:
    """``access-control-allow-origin`` → ``Access-Control-Allow-Origin``; other names as
    they are."""
    if not name.startswith(b"access-control-"):
        return name
    return b"-".join(part.capitalize() for part in name.split(b"-"))


LOCALHOST_ORIGINS = "localhost"
"""``server.cors_origins`` keyword (llama-server's): any origin on this machine's loopback,
``LOCALHOST_ORIGIN_RE``."""
LOCALHOST_ORIGIN_RE = r"https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?"


def _warm_tokenizer(runtime: Runtime, model_id: str) -> None:
    """Load a generative model's tokenizer, its prompt-length bound (which may build the
    token table, about a second) and its grammar vocabulary (1-3 s for 262,144 tokens), so
    no request waits for them: the vocabulary is built in Python and llguidance holding the
    GIL, so built by the first constrained request it stalled the event loop, and every
    other request with it, for as long."""
    tok = runtime.tokenizer(model_id)
    tok.max_token_bytes()
    try:
        warm_vocabulary(tok)
    except ValueError as exc:  # e.g. no EOS token: constrained requests get the reason
        log.warning("model %s: no grammar vocabulary: %s", model_id, exc)


async def _start_grpc(ctx: AppContext) -> Any:
    """The gRPC server on ``server.grpc_port`` (same event loop as HTTP), or None when it
    is not configured. Imported here: it needs the ``grpc`` extra."""
    port = ctx.config.server.grpc_port
    if port is None:
        return None
    try:
        from sluice.server.grpc.server import GrpcServer
    except ImportError as exc:
        raise RuntimeError(f"server.grpc_port is set but the grpc extra is not installed "
                           f"(pip install 'sluice[grpc]'): {exc}") from None
    server = GrpcServer(ctx, ctx.config.server.hosts, port)
    ctx.grpc_port = await server.start()
    return server
