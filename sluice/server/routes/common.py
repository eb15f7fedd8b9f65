"""What the HTTP routes share: the context and tenant of a request, unknown body fields,
racing a client disconnect, and the runner that answers a generation as one JSON body or as
an SSE stream. Building and admitting requests is the serving core's
(``sluice.server.core``); this module is only HTTP."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Annotated, Any, Protocol

from fastapi import Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel

from sluice.config import TenantConfig
from sluice.engine.request import Final, PromptProgress, RequestStatus, TokenEvent
from sluice.engine.request import Request as RtRequest
from sluice.policy.capacity.keep_alive import KeepAlive
from sluice.server.context import AppContext
from sluice.server.core import (
    Generation,
    admit,
    decision_headers,
    final_api_error,
    one_shot_requests,
)
from sluice.server.core.output import Failed, OutputEvent, OutputSplitter, output_events
from sluice.server.errors import APIError, bad_param
from sluice.server.schemas.base import ignored_fields
from sluice.server.shapes.base import Shape

log = logging.getLogger("sluice.server")

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"description": desc}
    for code, desc in [
        (400, "invalid request"), (401, "missing or invalid API key"),
        (403, "not permitted (admin routes without an admin key, a foreign tenant_id)"),
        (404, "unknown model"), (413, "body too large"), (429, "quota exceeded"),
        (500, "backend failure"), (503, "overloaded or draining"), (504, "deadline passed"),
    ]
}


def ctx_of(request: Request) -> AppContext:
    """The app's context (set by ``create_app``)."""
    ctx: AppContext = request.app.state.ctx
    return ctx


async def request_tenant(request: Request) -> TenantConfig:
    """The caller's tenant; resolved before the body is validated, so a bad key is 401."""
    return ctx_of(request).auth.tenant(request)


Tenant = Annotated[TenantConfig, Depends(request_tenant)]


IGNORED_HEADER = "x-sluice-ignored-fields"
_HEADER_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def body_headers(request: Request, body: BaseModel) -> dict[str, str]:
    """Unknown fields of ``body``: ignored, named in ``x-sluice-ignored-fields`` and a debug
    log line; with ``server.strict_fields`` a 400 naming the first."""
    ignored = ignored_fields(body)
    if not ignored:
        return {}
    if ctx_of(request).config.server.strict_fields:
        raise bad_param(ignored[0], f"Invalid value for '{ignored[0]}': Extra inputs are not "
                                    f"permitted")
    log.debug("%s %s: ignored unknown fields %s", request.method, request.url.path,
              ignored[:32])
    names = ["".join(ch if ch in _HEADER_SAFE else "?" for ch in name[:64])
             for name in ignored[:32]]
    return {IGNORED_HEADER: ",".join(names)}


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def race_disconnect(request: Request, awaitable: Any) -> Any | None:
    """The awaitable's result, or None if the client went away first."""
    task = asyncio.ensure_future(awaitable)
    watch = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if task in done:
        return task.result()
    task.cancel()
    return None


def sse(payload: dict[str, Any] | str) -> bytes:
    """One SSE ``data:`` line (compact JSON, or the string as it is)."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


async def run_generative(
    request: Request,
    gen: Generation,
    shape: Shape,
    *,
    stream: bool,
    include_usage: bool,
    headers: dict[str, str] | None = None,
    keep_events: bool = False,
) -> Response:
    """Answer the admitted ``gen``: one JSON body (``shape.full``, given the token events
    when ``keep_events``), or (``stream``) SSE chunks from ``shape.on_token`` and
    ``shape.on_final`` ending with ``shape.done_marker`` (``[DONE]``). A client that
    disconnects cancels the request (499)."""
    ctx = ctx_of(request)
    req, handle = gen.request, gen.handle
    extra = dict(headers or {})
    if not stream:
        events: list[TokenEvent] = []

        async def consume() -> Final | None:
            async for event in handle.events():
                if keep_events and isinstance(event, TokenEvent):
                    events.append(event)
            return handle.final

        final = await race_disconnect(request, consume())
        if final is None:
            handle.cancel()
            return Response(status_code=499)
        if final.status != RequestStatus.COMPLETED:
            raise _with_headers(final_api_error(final), req)
        if ctx.config.server.log_content:
            log.debug("request %s completion: %r", req.request_id, final.text)
        return JSONResponse(shape.full(final, events), headers={**decision_headers(req), **extra})

    stream_events = handle.events().__aiter__()
    first = await race_disconnect(request, stream_events.__anext__())
    if first is None:
        handle.cancel()
        return Response(status_code=499)
    if isinstance(first, Final) and first.status != RequestStatus.COMPLETED:
        raise _with_headers(final_api_error(first), req)

    async def body() -> AsyncIterator[bytes]:
        event: Any = first
        try:
            while True:
                if isinstance(event, Final):
                    if event.status == RequestStatus.COMPLETED:
                        for chunk in shape.on_final(event):
                            yield sse(chunk)
                        if include_usage:
                            yield sse(shape.usage_chunk(event))
                    else:
                        yield sse(shape.error_chunk(final_api_error(event)))
                    if shape.done_marker is not None:
                        yield sse(shape.done_marker)
                    return
                chunks = (shape.on_progress(event) if isinstance(event, PromptProgress)
                          else shape.on_token(event))
                for chunk in chunks:
                    yield sse(chunk)
                event = await stream_events.__anext__()
        finally:
            if handle.final is None:
                handle.cancel()

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={**decision_headers(req), **extra,
                                      "cache-control": "no-cache"})


class OutputRenderer(Protocol):
    """How an API renders the core's output events: one body for a completed request's
    events (the last a ``Done``), or a stream (``opening``, then ``render`` per batch, and
    ``progress`` for each prompt progress report; a ``Failed`` in the batch renders as the
    API's in-stream error)."""

    def body(self, events: Sequence[OutputEvent]) -> dict[str, Any]: ...

    def opening(self) -> list[bytes]: ...

    def render(self, events: Sequence[OutputEvent]) -> list[bytes]: ...

    def progress(self, progress: PromptProgress) -> list[bytes]: ...


async def run_output(request: Request, gen: Generation, splitter: OutputSplitter,
                     renderer: OutputRenderer, *, stream: bool,
                     headers: dict[str, str] | None = None) -> Response:
    """Answer the admitted ``gen`` through ``splitter`` and ``renderer``: one JSON body, or
    (``stream``) the renderer's SSE events. A failure before the first token is an HTTP
    error (the adapter's error shape); a client that disconnects cancels the request."""
    extra = dict(headers or {})
    req = gen.request
    if not stream:
        async def consume() -> list[OutputEvent]:
            return [event async for event in output_events(gen, splitter)]

        events = await race_disconnect(request, consume())
        if events is None:
            gen.cancel()
            return Response(status_code=499)
        if isinstance(events[-1], Failed):
            raise _with_headers(events[-1].error, req)
        return JSONResponse(renderer.body(events), headers={**decision_headers(req), **extra})

    raw = gen.events().__aiter__()
    first = await race_disconnect(request, raw.__anext__())
    if first is None:
        gen.cancel()
        return Response(status_code=499)
    if isinstance(first, Final) and first.status != RequestStatus.COMPLETED:
        raise _with_headers(final_api_error(first), req)

    async def body() -> AsyncIterator[bytes]:
        event: TokenEvent | PromptProgress | Final = first
        try:
            for chunk in renderer.opening():
                yield chunk
            while True:
                if isinstance(event, Final):
                    for chunk in renderer.render(splitter.finish(event)):
                        yield chunk
                    return
                if isinstance(event, PromptProgress):
                    for chunk in renderer.progress(event):
                        yield chunk
                    event = await raw.__anext__()
                    continue
                batch = splitter.push(event.text)
                if batch:
                    for chunk in renderer.render(batch):
                        yield chunk
                event = await raw.__anext__()
        finally:
            gen.cancel()

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={**decision_headers(req), **extra,
                                      "cache-control": "no-cache"})


def _with_headers(err: APIError, req: RtRequest) -> APIError:
    err.headers.update(decision_headers(req))
    return err


async def one_shot(
    request: Request, model: str, tenant: TenantConfig, inputs: list[Any],
    priority: int | None, deadline_ms: float | None, keep_alive: KeepAlive | None = None,
) -> tuple[list[Final], list[RtRequest]]:
    """Submit one request per input, await them all (a client that leaves cancels them)."""
    ctx = ctx_of(request)
    reqs = one_shot_requests(ctx, request.headers, model, tenant, inputs, priority,
                             deadline_ms, keep_alive)
    handles = await admit(ctx, reqs)
    finals = await race_disconnect(request, asyncio.gather(*(h.result() for h in handles)))
    if finals is None:
        for h in handles:
            h.cancel()
        raise APIError(499, "client disconnected", code="cancelled")
    for final, r in zip(finals, reqs, strict=True):
        if final.status != RequestStatus.COMPLETED:
            raise _with_headers(final_api_error(final), r)
    return list(finals), reqs


