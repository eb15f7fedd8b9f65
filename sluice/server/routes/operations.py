"""The operations surface: liveness, readiness, Prometheus metrics, the status page; and the
chat page at ``/`` (a first try of the default model in a browser, as llama-server's)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from sluice.server.errors import APIError
from sluice.server.health import liveness, readiness
from sluice.server.pages import STATUS_PAGE, chat_page
from sluice.server.routes.common import ctx_of
from sluice.server.status import status_json

PROCESS_START_UNIX = int(time.time())
"""When this process started serving (Unix seconds; set when the routes are imported)."""

router = APIRouter(tags=["operations"])


@router.get("/health", responses={503: {"description": "a thread is dead"}})
@router.get("/v1/health", include_in_schema=False)
async def health(request: Request) -> JSONResponse:
    """Alive: the dispatcher and the worker supervisor run, every worker is up or being
    replaced, and the default model did not fail to load (503 with the reason otherwise);
    also at llama-server's ``/v1/health``."""
    state = liveness(ctx_of(request))
    return JSONResponse(dict(state.body), status_code=200 if state.ok else 503)


@router.get("/ready", responses={503: {"description": "not ready"}})
async def ready(request: Request) -> JSONResponse:
    """A request sent now can be served: the default model is loaded on a worker (or
    loadable again after an eviction), every worker is up, and the server is not
    draining."""
    state = readiness(ctx_of(request))
    return JSONResponse(dict(state.body), status_code=200 if state.ok else 503)


@router.get("/metrics", response_class=Response,
            responses={401: {"description": "metrics key required"}})
async def metrics(request: Request) -> Response:
    """Prometheus text exposition (the metrics key, when ``server.metrics_key`` is set);
    ``Process-Start-Time-Unix``: when the server process started (llama-server's header,
    which tells a scraper that counters restarted)."""
    ctx_of(request).auth.require_metrics(request)
    response = Response(generate_latest(ctx_of(request).registry),
                        media_type=CONTENT_TYPE_LATEST)
    # the name as llama-server writes it (Starlette lowercases names given as headers=, and
    # llama.cpp's suite reads this one case-sensitively)
    response.raw_headers.append((b"Process-Start-Time-Unix", str(PROCESS_START_UNIX).encode()))
    return response


@router.get("/", response_class=HTMLResponse)
async def chat(request: Request) -> HTMLResponse:
    """A chat page: a model picker (``/v1/models``), a key field, and answers streamed from
    ``/v1/chat/completions`` as they are generated; the default model preselected (404 with
    ``server.web_ui = false``)."""
    if not ctx_of(request).config.server.web_ui:
        raise APIError(404, "Not Found", code="not_found")
    return HTMLResponse(chat_page(ctx_of(request).config.default_model))


@router.get("/status", response_class=HTMLResponse)
async def status_page() -> HTMLResponse:
    """A live page: the last ten minutes as charts (tokens/s, requests waiting and running,
    TTFT and TPOT p95, refusals by reason), models, workers, tenants against their quotas,
    the last decisions. The page itself holds no data; with a metrics key, open it as
    ``/status#key=<metrics key>``."""
    return HTMLResponse(STATUS_PAGE)


@router.get("/status.json", responses={401: {"description": "metrics key required"}})
async def status_data(request: Request) -> dict[str, Any]:
    """The numbers behind the status page (the metrics key, when one is set)."""
    ctx = ctx_of(request)
    ctx.auth.require_metrics(request)
    return status_json(ctx)
