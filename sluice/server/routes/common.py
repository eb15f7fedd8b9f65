"""What the route modules share: the context and tenant of a request, building runtime
requests (model kind, tokenizer, context limits, priority and deadline), admission through the
tenant's quota then the runtime, racing a client disconnect, the decision headers, and the
runner that answers a generative request as JSON or as an SSE stream."""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import AsyncIterator, Mapping
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel

from sluice.backends.base import ModelSpec, Tokenizer
from sluice.backends.chat import ChatPrompt, chat_tokens
from sluice.config import TenantConfig
from sluice.engine.bridge import AsyncHandle
from sluice.engine.request import Final, RequestStatus, SamplingParams, TokenEvent
from sluice.engine.request import Request as RtRequest
from sluice.engine.runtime import Rejected
from sluice.server import access
from sluice.server.context import AppContext
from sluice.server.errors import (
    APIError,
    bad_param,
    final_error,
    rejection_error,
    unknown_model,
)
from sluice.server.schemas import ignored_fields
from sluice.server.shapes import Shape

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


def spec_of_kind(ctx: AppContext, model: str, kind: str) -> ModelSpec:
    """The model's spec: 404 when unknown, 400 ``model_kind_mismatch`` when not ``kind``."""
    spec = ctx.runtime.spec_for(model)
    if spec is None:
        raise unknown_model(model)
    if spec.kind != kind:
        want = "a generative" if kind == "generative" else "an embedding/one-shot"
        raise bad_param("model", f"The model '{model}' is not {want} model",
                        code="model_kind_mismatch")
    return spec


def tokenizer_of(ctx: AppContext, model: str) -> Tokenizer:
    """The model's tokenizer; a model file that cannot even be read (missing, corrupt,
    truncated) is the model failing to load: 500 ``model_load_failed``."""
    try:
        return ctx.runtime.tokenizer(model)
    except Exception as exc:
        log.error("model %s: tokenizer failed to load: %s", model, exc)
        raise APIError(500, "The model could not be loaded.", type="server_error",
                       code="model_load_failed") from None


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


def _header_number(headers: Mapping[str, str], name: str, lo: float,
                   hi: float) -> float | None:
    raw = headers.get(name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise bad_param(name, f"Header {name} must be a number") from None
    if not lo < value <= hi:
        raise bad_param(name, f"Header {name} must be in ({lo}, {hi}]")
    return value


def controls(
    ctx: AppContext, headers: Mapping[str, str], tenant: TenantConfig, priority: int | None,
    deadline_ms: float | None,
) -> tuple[int, float | None]:
    """Priority and absolute deadline: body (or the gRPC deadline), then headers (or gRPC
    metadata), then the tenant's defaults. A request may lower its priority but never raise
    it above the tenant's ceiling (``priority_ceiling``): asking for more gets the ceiling."""
    if priority is None:
        header = _header_number(headers, "x-sluice-priority", -1, 9)
        if header is not None and not header.is_integer():
            raise bad_param("x-sluice-priority", "Header x-sluice-priority must be an integer")
        priority = int(header) if header is not None else tenant.priority
    priority = max(priority, tenant.most_urgent_priority)
    if deadline_ms is None:
        deadline_ms = _header_number(headers, "x-sluice-deadline-ms", 0, 86_400_000)
    if deadline_ms is None:
        deadline_ms = tenant.default_deadline_ms
    deadline_s = None if deadline_ms is None else ctx.runtime.clock() + deadline_ms / 1000.0
    return priority, deadline_s


def ttft_deadline(ctx: AppContext, headers: Mapping[str, str],
                  tenant: TenantConfig) -> float | None:
    """A generative request's absolute first-token deadline: the ``x-sluice-ttft-deadline-ms``
    header (or gRPC metadata), then the tenant's default; ``None`` leaves the model's
    default (``ttft_deadline_ms``) to the runtime."""
    ms = _header_number(headers, "x-sluice-ttft-deadline-ms", 0, 86_400_000)
    if ms is None:
        ms = tenant.default_ttft_deadline_ms
    return None if ms is None else ctx.runtime.clock() + ms / 1000.0


def ttft_target(ctx: AppContext, headers: Mapping[str, str],
                tenant: TenantConfig) -> float | None:
    """A generative request's absolute first-token target (soft): the
    ``x-sluice-ttft-target-ms`` header (or gRPC metadata), then the tenant's default;
    ``None`` leaves the model's default (``ttft_target_ms``) to the runtime."""
    ms = _header_number(headers, "x-sluice-ttft-target-ms", 0, 86_400_000)
    if ms is None:
        ms = tenant.default_ttft_target_ms
    return None if ms is None else ctx.runtime.clock() + ms / 1000.0


def decision_headers(req: RtRequest) -> dict[str, str]:
    """The ``x-sluice-*`` headers that say how the runtime decided (id, tenant, priority
    served at, worker, queue wait, route, variant, predicted wait), and what to check a
    planned request's prediction against (``plan_headers``)."""
    headers = {"x-sluice-request-id": str(req.request_id), "x-sluice-tenant": req.tenant_id,
               "x-sluice-priority": str(req.priority)}
    if req.worker_id is not None:
        headers["x-sluice-worker"] = str(req.worker_id)
    t = req.times
    if t.started_s is not None and t.queued_s is not None:
        headers["x-sluice-queue-wait-ms"] = f"{(t.started_s - t.queued_s) * 1000:.1f}"
    if req.route_reason:
        headers["x-sluice-route"] = req.route_reason.replace("\n", " ")[:200]
    if req.variant:
        headers["x-sluice-variant"] = req.variant
    if req.predicted_wait_s is not None:
        headers["x-sluice-predicted-wait-ms"] = f"{req.predicted_wait_s * 1000:.1f}"
    return headers | plan_headers(req)


def plan_headers(req: RtRequest) -> dict[str, str]:
    """HTTP only (diagnostics, not in gRPC's ``Decision``): for a one-shot request, the
    batch it ran in and its run time; for one that named a model group, the planner's
    reason, predicted sojourn (from its arrival) and predicted run time of the batch it
    was placed in, beside the server's own sojourn, and
    whether the pool was idle and the most accurate variant would have met the deadline
    alone (``VariantChoice``). ``plan-reason`` is ``replanned`` when it ran elsewhere."""
    headers: dict[str, str] = {}
    t = req.times
    if req.batch_size is not None:
        headers["x-sluice-batch-size"] = str(req.batch_size)
        if t.started_s is not None and t.finished_s is not None:
            headers["x-sluice-run-ms"] = f"{(t.finished_s - t.started_s) * 1000:.1f}"
    plan = req.plan
    if plan is None:
        return headers
    moved = plan.variant is not None and req.variant != plan.variant
    headers["x-sluice-plan-reason"] = "replanned" if moved else plan.reason
    if math.isfinite(plan.predicted_sojourn_s):
        headers["x-sluice-predicted-sojourn-ms"] = f"{plan.predicted_sojourn_s * 1000:.1f}"
    chosen = next((p for p in plan.predictions if p.variant == plan.variant), None)
    if chosen is not None:  # its batch's time, before the pessimism factor
        headers["x-sluice-predicted-run-ms"] = f"{chosen.service_s * 1000:.1f}"
    if t.finished_s is not None:
        headers["x-sluice-sojourn-ms"] = f"{(t.finished_s - req.arrival_s) * 1000:.1f}"
    if plan.pool_idle is not None:
        headers["x-sluice-pool-idle"] = str(int(plan.pool_idle))
    if plan.accurate_fits_alone is not None:
        headers["x-sluice-accurate-fits-alone"] = str(int(plan.accurate_fits_alone))
    # the low-load test's inputs: the group's arrival rate, its standard error, the line
    headers["x-sluice-plan-arrival"] = (f"{plan.arrival_per_s:.3f} {plan.arrival_stderr_per_s:.3f} "
                                        f"{plan.low_load_line_per_s:.3f}")
    return headers


def check_prompt_length(tok: Tokenizer, text: str, param: str, *,
                        whole_context: bool = False) -> None:
    """Refuse (400 ``context_length_exceeded``) a prompt whose length alone proves it cannot
    fit one sequence (``whole_context``: the model's whole context, for ``/tokenize``),
    before any tokenizing: a token stands for at most ``max_token_bytes()`` bytes, so the
    text has at least ``bytes / max_token_bytes()`` tokens. Linear in the text, cheap next to
    tokenizing it (seconds for a megabyte of special-token text on llama.cpp)."""
    most = tok.max_token_bytes()
    if most is None:
        return
    n_bytes = len(text.encode("utf-8"))
    least_tokens = -(-n_bytes // most)
    room, where = ((tok.n_ctx_per_seq * tok.n_seq_max, "in all") if whole_context
                   else (tok.n_ctx_per_seq, "per sequence"))
    if least_tokens >= room:
        raise APIError(
            400,
            f"This model's context holds {room} tokens {where}; the prompt "
            f"({n_bytes} bytes) has at least {least_tokens}.",
            param=param, code="context_length_exceeded",
        )


def _bounded_tokenize(tok: Tokenizer, text: str, param: str) -> list[int]:
    check_prompt_length(tok, text, param)
    return tok.tokenize(text, add_bos=True)


def _bounded_chat_tokens(tok: Tokenizer, prompt: ChatPrompt, param: str) -> list[int]:
    check_prompt_length(tok, prompt.text, param)
    return chat_tokens(tok, prompt)


async def tokenize_text(tok: Tokenizer, text: str, param: str) -> list[int]:
    """A text prompt's tokens (BOS first), in a worker thread, never on the event loop;
    refused by its length first when it cannot fit (``check_prompt_length``)."""
    return await asyncio.to_thread(_bounded_tokenize, tok, text, param)


async def tokenize_chat(tok: Tokenizer, prompt: ChatPrompt, param: str) -> list[int]:
    """A chat prompt's tokens (user text plain), as ``tokenize_text``."""
    return await asyncio.to_thread(_bounded_chat_tokens, tok, prompt, param)


def _max_tokens(
    ctx: AppContext, tok: Tokenizer, n_prompt: int, asked: int | None,
    names: tuple[str, str] = ("messages", "max_tokens"),
) -> int:
    """``names``: the request's fields for the prompt and the token limit (for ``param``)."""
    room = tok.n_ctx_per_seq - n_prompt
    if room <= 0:
        raise APIError(
            400,
            f"This model's context holds {tok.n_ctx_per_seq} tokens per sequence; the prompt "
            f"has {n_prompt}.", param=names[0], code="context_length_exceeded",
        )
    if asked is None:
        return min(ctx.config.server.default_max_tokens, room)
    if n_prompt + asked > tok.n_ctx_per_seq:
        raise APIError(
            400,
            f"This model's context holds {tok.n_ctx_per_seq} tokens per sequence; the prompt "
            f"({n_prompt}) plus {names[1]} ({asked}) exceeds it.",
            param=names[1], code="context_length_exceeded",
        )
    return asked


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _race_disconnect(request: Request, awaitable: Any) -> Any | None:
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


async def admit(ctx: AppContext, reqs: list[RtRequest]) -> list[AsyncHandle]:
    """The tenant's quota (429), then runtime admission (503), for the runtime requests of
    one API request, admitted as one unit (``Runtime.open_unit``): all or none, and never
    refused for holding more inputs than the queue. On a refusal every request has ended
    ``REJECTED``, so the quota reservation is given back."""
    access.note_admitted(reqs)
    await ctx.quota.admit(reqs)
    try:
        return ctx.runtime.open_unit(reqs)
    except Rejected as exc:
        raise rejection_error(exc.rejection) from None


def _sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def final_api_error(final: Final) -> APIError:
    """The error for a request that ended without completing."""
    return final_error(final.error_code, final.error, final.status.name, final.retry_after_s)


async def run_generative(
    request: Request,
    req: RtRequest,
    shape: Shape,
    *,
    stream: bool,
    include_usage: bool,
    headers: dict[str, str] | None = None,
    keep_events: bool = False,
) -> Response:
    """Admit ``req`` and answer it: one JSON body (``shape.full``, given the token events
    when ``keep_events``), or (``stream``) SSE chunks from ``shape.on_token`` and
    ``shape.on_final`` ending with ``[DONE]``. A client that disconnects cancels the request
    (499)."""
    ctx = ctx_of(request)
    [handle] = await admit(ctx, [req])
    extra = dict(headers or {})
    if not stream:
        events: list[TokenEvent] = []

        async def consume() -> Final | None:
            async for event in handle.events():
                if keep_events and isinstance(event, TokenEvent):
                    events.append(event)
            return handle.final

        final = await _race_disconnect(request, consume())
        if final is None:
            handle.cancel()
            return Response(status_code=499)
        if final.status != RequestStatus.COMPLETED:
            raise _with_headers(final_api_error(final), req)
        if ctx.config.server.log_content:
            log.debug("request %s completion: %r", req.request_id, final.text)
        return JSONResponse(shape.full(final, events), headers={**decision_headers(req), **extra})

    stream_events = handle.events().__aiter__()
    first = await _race_disconnect(request, stream_events.__anext__())
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
                            yield _sse(chunk)
                        if include_usage:
                            yield _sse(shape.usage_chunk(event))
                    else:
                        err = final_api_error(event)
                        yield _sse({"error": {"message": err.message, "type": err.type,
                                              "param": None, "code": err.code}})
                    yield _sse("[DONE]")
                    return
                for chunk in shape.on_token(event):
                    yield _sse(chunk)
                event = await stream_events.__anext__()
        finally:
            if handle.final is None:
                handle.cancel()

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={**decision_headers(req), **extra,
                                      "cache-control": "no-cache"})


def _with_headers(err: APIError, req: RtRequest) -> APIError:
    err.headers.update(decision_headers(req))
    return err


async def generative_request(
    ctx: AppContext,
    headers: Mapping[str, str],
    model: str,
    tenant: TenantConfig,
    *,
    text: str | None,
    token_ids: list[int] | None,
    max_tokens: int | None,
    params: dict[str, Any],
    priority: int | None,
    deadline_ms: float | None,
    names: tuple[str, str] = ("messages", "max_tokens"),
) -> RtRequest:
    """A generative runtime request from text (tokenized here) or token ids, with its
    token limit checked against the context and the tenant's priority and deadline.
    ``headers``: the HTTP headers or gRPC metadata (``x-sluice-*`` controls)."""
    spec_of_kind(ctx, model, "generative")
    tok = tokenizer_of(ctx, model)
    if token_ids is not None:
        bad = [t for t in token_ids if not 0 <= t < tok.vocab_size]
        if bad:
            raise bad_param("prompt", f"token ids must be in [0, {tok.vocab_size}); got {bad[0]}")
        tokens = token_ids
    else:
        assert text is not None
        tokens = await tokenize_text(tok, text, names[0])
        if ctx.config.server.log_content:
            access.note_prompt(text)
    n = _max_tokens(ctx, tok, len(tokens), max_tokens, names)
    prio, deadline_s = controls(ctx, headers, tenant, priority, deadline_ms)
    return ctx.runtime.new_request(
        model,
        prompt_tokens=tokens,
        params=SamplingParams(max_tokens=n, **params),
        tenant_id=tenant.id,
        priority=prio,
        deadline_s=deadline_s,
        ttft_deadline_s=ttft_deadline(ctx, headers, tenant),
        ttft_target_s=ttft_target(ctx, headers, tenant),
    )


def one_shot_requests(
    ctx: AppContext, headers: Mapping[str, str], model: str, tenant: TenantConfig,
    inputs: list[Any], priority: int | None, deadline_ms: float | None,
) -> list[RtRequest]:
    """One runtime request per input (so dynamic batching sees each)."""
    prio, deadline_s = controls(ctx, headers, tenant, priority, deadline_ms)
    return [
        ctx.runtime.new_request(model, input=x, tenant_id=tenant.id, priority=prio,
                                deadline_s=deadline_s)
        for x in inputs
    ]


async def one_shot(
    request: Request, model: str, tenant: TenantConfig, inputs: list[Any],
    priority: int | None, deadline_ms: float | None,
) -> tuple[list[Final], list[RtRequest]]:
    """Submit one request per input, await them all (a client that leaves cancels them)."""
    ctx = ctx_of(request)
    reqs = one_shot_requests(ctx, request.headers, model, tenant, inputs, priority,
                             deadline_ms)
    handles = await admit(ctx, reqs)
    finals = await _race_disconnect(request, asyncio.gather(*(h.result() for h in handles)))
    if finals is None:
        for h in handles:
            h.cancel()
        raise APIError(499, "client disconnected", code="cancelled")
    for final, r in zip(finals, reqs, strict=True):
        if final.status != RequestStatus.COMPLETED:
            raise _with_headers(final_api_error(final), r)
    return list(finals), reqs


def embedding_spec(ctx: AppContext, model: str) -> ModelSpec:
    """An embedding model's spec (404 unknown, 400 ``model_kind_mismatch`` otherwise)."""
    spec = spec_of_kind(ctx, model, "oneshot")
    if spec.task != "embedding":
        raise bad_param("model", f"The model '{model}' is not an embedding model",
                        code="model_kind_mismatch")
    return spec


def model_list(ctx: AppContext) -> list[dict[str, Any]]:
    """Configured models and groups, with where each model is resident (``/v1/models``,
    gRPC ``ListModels``)."""
    snap = ctx.runtime.snapshot()
    data: list[dict[str, Any]] = []
    for spec in ctx.runtime.specs.values():
        resident_on = [w.worker_id for w in snap.workers if spec.model_id in w.resident]
        failed = [w.failed_models[spec.model_id] for w in snap.workers
                  if spec.model_id in w.failed_models]
        data.append({
            "id": spec.model_id,
            "object": "model",
            "created": 0,
            "owned_by": "sluice",
            "kind": spec.kind,
            "task": spec.task,
            "resident": bool(resident_on),
            "resident_on": resident_on,
            "status": "failed" if failed and not resident_on else "available",
        })
    for group_id, group in ctx.runtime.variants.groups.items():
        data.append({"id": group_id, "object": "model", "created": 0, "owned_by": "sluice",
                     "kind": "group", "task": ctx.runtime.variants.lead_spec(group_id).task,
                     "variants": list(group.variants), "policy": group.planner.policy})
    return data
