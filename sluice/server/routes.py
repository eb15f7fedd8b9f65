"""OpenAI-compatible, native and admin routes."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from sluice.backends.base import ModelSpec, Tokenizer
from sluice.config import TenantConfig
from sluice.engine.request import Final, RequestStatus, SamplingParams
from sluice.engine.request import Request as RtRequest
from sluice.engine.runtime import AsyncHandle, Rejected, Runtime
from sluice.server.errors import (
    APIError,
    bad_param,
    final_error,
    rejection_error,
    unknown_model,
)
from sluice.server.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    InferRequest,
)
from sluice.server.shapes import ChatShape, CompletionShape, InferShape, Shape

if TYPE_CHECKING:
    from sluice.server.app import AppContext

log = logging.getLogger("sluice.server")
api_router = APIRouter()
admin_router = APIRouter(prefix="/admin", tags=["admin"])

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"description": desc}
    for code, desc in [
        (400, "invalid request"), (401, "missing or invalid API key"),
        (404, "unknown model"), (413, "body too large"), (429, "quota exceeded"),
        (500, "backend failure"), (503, "overloaded or draining"), (504, "deadline passed"),
    ]
}


def _ctx(request: Request) -> AppContext:
    ctx: AppContext = request.app.state.ctx
    return ctx


async def _tenant(request: Request) -> TenantConfig:
    """The caller's tenant; resolved before the body is validated, so a bad key is 401."""
    return _ctx(request).auth.tenant(request)


Tenant = Annotated[TenantConfig, Depends(_tenant)]


def _spec(ctx: AppContext, model: str, kind: str) -> ModelSpec:
    spec = ctx.runtime.spec_for(model)
    if spec is None:
        raise unknown_model(model)
    if spec.kind != kind:
        want = "a generative" if kind == "generative" else "an embedding/one-shot"
        raise bad_param("model", f"The model '{model}' is not {want} model",
                        code="model_kind_mismatch")
    return spec


def _tokenizer(ctx: AppContext, model: str) -> Tokenizer:
    """The model's tokenizer; a model file that cannot even be read (missing, corrupt,
    truncated) is the model failing to load: 500 ``model_load_failed``."""
    try:
        return ctx.runtime.tokenizer(model)
    except Exception as exc:
        log.error("model %s: tokenizer failed to load: %s", model, exc)
        raise APIError(500, "The model could not be loaded.", type="server_error",
                       code="model_load_failed") from None


def _header_int(request: Request, name: str, lo: float, hi: float) -> float | None:
    raw = request.headers.get(name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise bad_param(name, f"Header {name} must be a number") from None
    if not lo < value <= hi:
        raise bad_param(name, f"Header {name} must be in ({lo}, {hi}]")
    return value


def _controls(
    request: Request, tenant: TenantConfig, priority: int | None, deadline_ms: float | None
) -> tuple[int, float | None]:
    """Priority and absolute deadline: body, then headers, then the tenant's defaults."""
    ctx = _ctx(request)
    if priority is None:
        header = _header_int(request, "x-sluice-priority", -1, 9)
        if header is not None and not header.is_integer():
            raise bad_param("x-sluice-priority", "Header x-sluice-priority must be an integer")
        priority = int(header) if header is not None else tenant.priority
    if deadline_ms is None:
        deadline_ms = _header_int(request, "x-sluice-deadline-ms", 0, 86_400_000)
    if deadline_ms is None:
        deadline_ms = tenant.default_deadline_ms
    deadline_s = None if deadline_ms is None else ctx.runtime.clock() + deadline_ms / 1000.0
    return priority, deadline_s


def _decision_headers(req: RtRequest) -> dict[str, str]:
    headers = {"x-sluice-request-id": str(req.request_id), "x-sluice-tenant": req.tenant_id}
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
    return headers


async def _tokenize(tok: Tokenizer, text: str, add_bos: bool) -> list[int]:
    if len(text) < 4096:
        return tok.tokenize(text, add_bos=add_bos)
    return await asyncio.to_thread(tok.tokenize, text, add_bos=add_bos)


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


def _open(ctx: AppContext, req: RtRequest) -> AsyncHandle:
    try:
        return ctx.runtime.open(req)
    except Rejected as exc:
        raise rejection_error(exc.rejection) from None


async def _admit(ctx: AppContext, reqs: list[RtRequest]) -> list[AsyncHandle]:
    """The tenant's quota (429), then runtime admission (503), for the runtime requests of
    one HTTP request. On a refusal the ones already submitted are cancelled and the rest
    ended, so the quota reservation is given back."""
    await ctx.quota.admit(reqs)
    handles: list[AsyncHandle] = []
    try:
        for r in reqs:
            handles.append(_open(ctx, r))
    except APIError:
        for h in handles:
            h.cancel()
        now = ctx.runtime.clock()
        for r in reqs[len(handles) + 1:]:
            r.finish(RequestStatus.CANCELLED, now, error="not submitted")
        raise
    return handles


def _sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def _error_of(final: Final) -> APIError:
    return final_error(final.error_code, final.error, final.status.name)


async def _run_generative(
    request: Request,
    req: RtRequest,
    shape: Shape,
    *,
    stream: bool,
    include_usage: bool,
) -> Response:
    ctx = _ctx(request)
    [handle] = await _admit(ctx, [req])
    if not stream:
        final = await _race_disconnect(request, handle.result())
        if final is None:
            handle.cancel()
            return Response(status_code=499)
        if final.status != RequestStatus.COMPLETED:
            raise _with_headers(_error_of(final), req)
        if ctx.config.server.log_content:
            log.debug("request %s completion: %r", req.request_id, final.text)
        return JSONResponse(shape.full(final), headers=_decision_headers(req))

    events = handle.events().__aiter__()
    first = await _race_disconnect(request, events.__anext__())
    if first is None:
        handle.cancel()
        return Response(status_code=499)
    if isinstance(first, Final) and first.status != RequestStatus.COMPLETED:
        raise _with_headers(_error_of(first), req)

    async def body() -> AsyncIterator[bytes]:
        sent_first = False
        event: Any = first
        try:
            while True:
                if isinstance(event, Final):
                    if event.status == RequestStatus.COMPLETED:
                        yield _sse(shape.end(event.finish_reason))
                        if include_usage:
                            yield _sse(shape.usage_chunk(event))
                    else:
                        err = _error_of(event)
                        yield _sse({"error": {"message": err.message, "type": err.type,
                                              "param": None, "code": err.code}})
                    yield _sse("[DONE]")
                    return
                if event.text or not sent_first:
                    yield _sse(shape.delta(event.text, first=not sent_first))
                    sent_first = True
                event = await events.__anext__()
        finally:
            if handle.final is None:
                handle.cancel()

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={**_decision_headers(req), "cache-control": "no-cache"})


def _with_headers(err: APIError, req: RtRequest) -> APIError:
    err.headers.update(_decision_headers(req))
    return err


async def _generative_request(
    request: Request,
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
    ctx = _ctx(request)
    _spec(ctx, model, "generative")
    tok = _tokenizer(ctx, model)
    if token_ids is not None:
        bad = [t for t in token_ids if not 0 <= t < tok.vocab_size]
        if bad:
            raise bad_param("prompt", f"token ids must be in [0, {tok.vocab_size}); got {bad[0]}")
        tokens = token_ids
    else:
        assert text is not None
        tokens = await _tokenize(tok, text, add_bos=True)
    n = _max_tokens(ctx, tok, len(tokens), max_tokens, names)
    prio, deadline_s = _controls(request, tenant, priority, deadline_ms)
    return ctx.runtime.new_request(
        model,
        prompt_tokens=tokens,
        params=SamplingParams(max_tokens=n, **params),
        tenant_id=tenant.id,
        priority=prio,
        deadline_s=deadline_s,
    )


def _sampling(body: ChatCompletionRequest | CompletionRequest) -> dict[str, Any]:
    return {
        "temperature": body.temperature,
        "top_p": body.top_p,
        "top_k": body.top_k,
        "seed": body.seed,
        "stop": body.stop_list(),
        "ignore_eos": body.ignore_eos,
    }


@api_router.post("/v1/chat/completions", tags=["openai"], responses=ERROR_RESPONSES)
async def chat_completions(
    body: ChatCompletionRequest, request: Request, tenant: Tenant
) -> Response:
    """OpenAI chat completions; ``stream`` gives SSE chunks ending with ``[DONE]``."""
    ctx = _ctx(request)
    _spec(ctx, body.model, "generative")
    tok = _tokenizer(ctx, body.model)
    prompt = tok.render_chat([{"role": m.role, "content": m.text()} for m in body.messages])
    req = await _generative_request(
        request, body.model, tenant, text=prompt, token_ids=None,
        max_tokens=body.max_completion_tokens or body.max_tokens, params=_sampling(body),
        priority=body.priority, deadline_ms=body.deadline_ms,
        names=("messages", "max_completion_tokens" if body.max_completion_tokens
               else "max_tokens"),
    )
    shape = ChatShape(f"chatcmpl-{req.request_id}", body.model)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return await _run_generative(request, req, shape, stream=body.stream,
                                 include_usage=include_usage)


@api_router.post("/v1/completions", tags=["openai"], responses=ERROR_RESPONSES)
async def completions(body: CompletionRequest, request: Request, tenant: Tenant) -> Response:
    """OpenAI text completions (one prompt per request)."""
    prompt = body.prompt
    text = prompt if isinstance(prompt, str) else (prompt[0] if isinstance(prompt[0], str)
                                                    else None)
    ids = None if text is not None else [int(t) for t in prompt]
    req = await _generative_request(
        request, body.model, tenant, text=text, token_ids=ids,
        max_tokens=body.max_tokens or 16, params=_sampling(body),
        priority=body.priority, deadline_ms=body.deadline_ms, names=("prompt", "max_tokens"),
    )
    shape = CompletionShape(f"cmpl-{req.request_id}", body.model)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return await _run_generative(request, req, shape, stream=body.stream,
                                 include_usage=include_usage)


async def _one_shot(
    request: Request, model: str, tenant: TenantConfig, inputs: list[Any],
    priority: int | None, deadline_ms: float | None,
) -> tuple[list[Final], list[RtRequest]]:
    """Submit one request per input (so dynamic batching sees each), await them all."""
    ctx = _ctx(request)
    prio, deadline_s = _controls(request, tenant, priority, deadline_ms)
    reqs = [
        ctx.runtime.new_request(model, input=x, tenant_id=tenant.id, priority=prio,
                                deadline_s=deadline_s)
        for x in inputs
    ]
    handles = await _admit(ctx, reqs)
    finals = await _race_disconnect(request, asyncio.gather(*(h.result() for h in handles)))
    if finals is None:
        for h in handles:
            h.cancel()
        raise APIError(499, "client disconnected", code="cancelled")
    for final, r in zip(finals, reqs, strict=True):
        if final.status != RequestStatus.COMPLETED:
            raise _with_headers(_error_of(final), r)
    return list(finals), reqs


def _encode(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
    return vector


@api_router.post("/v1/embeddings", tags=["openai"], responses=ERROR_RESPONSES)
async def embeddings(body: EmbeddingRequest, request: Request, tenant: Tenant) -> Response:
    """OpenAI embeddings for one-shot embedding models."""
    ctx = _ctx(request)
    spec = _spec(ctx, body.model, "oneshot")
    if spec.task != "embedding":
        raise bad_param("model", f"The model '{body.model}' is not an embedding model",
                        code="model_kind_mismatch")
    inputs = [body.input] if isinstance(body.input, str) else list(body.input)
    finals, reqs = await _one_shot(request, body.model, tenant, inputs, body.priority,
                                   body.deadline_ms)
    n_tokens = sum(len(str(x).split()) for x in inputs)
    payload = {
        "object": "list",
        "data": [{"object": "embedding", "index": i,
                  "embedding": _encode(f.result, body.encoding_format)}
                 for i, f in enumerate(finals)],
        "model": body.model,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    }
    return JSONResponse(payload, headers=_decision_headers(reqs[-1]))


@api_router.post("/v1/infer", tags=["native"], responses=ERROR_RESPONSES)
async def infer(body: InferRequest, request: Request, tenant: Tenant) -> Response:
    """sluice's native endpoint: any model, with tenant, priority, deadline."""
    ctx = _ctx(request)
    if body.tenant_id is not None and body.tenant_id != tenant.id:
        if ctx.auth.enabled:
            raise APIError(403, "tenant_id does not match the API key's tenant",
                           type="permission_error", param="tenant_id", code="tenant_mismatch")
        tenant = TenantConfig(id=body.tenant_id)
    spec = ctx.runtime.spec_for(body.model)
    if spec is None:
        raise unknown_model(body.model)
    if spec.kind == "oneshot":
        if not isinstance(body.input, str):
            raise bad_param("input", "one-shot models take a text input")
        finals, reqs = await _one_shot(request, body.model, tenant, [body.input], body.priority,
                                       body.deadline_ms)
        shape = InferShape(f"infer-{reqs[0].request_id}", body.model)
        return JSONResponse(shape.full(finals[0]), headers=_decision_headers(reqs[0]))
    tok = _tokenizer(ctx, body.model)
    if isinstance(body.input, str):
        text = body.input
    else:
        text = tok.render_chat([{"role": m.role, "content": m.text()} for m in body.input])
    req = await _generative_request(
        request, body.model, tenant, text=text, token_ids=None,
        max_tokens=body.max_new_tokens,
        params={"temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k,
                "seed": body.seed, "stop": tuple(body.stop or ())},
        priority=body.priority, deadline_ms=body.deadline_ms,
        names=("input", "max_new_tokens"),
    )
    shape = InferShape(f"infer-{req.request_id}", body.model)
    return await _run_generative(request, req, shape, stream=body.stream, include_usage=True)


@api_router.get("/v1/models", tags=["openai"], responses={401: {"description": "bad key"}})
async def list_models(request: Request, tenant: Tenant) -> dict[str, Any]:
    """Configured models, with where each is resident."""
    ctx = _ctx(request)
    snap = ctx.runtime.snapshot()
    data = []
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
    return {"object": "list", "data": data}


MODEL_ID = Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


@admin_router.post("/models/{model_id}/{action}", responses=ERROR_RESPONSES)
async def admin_model(
    request: Request,
    model_id: str = MODEL_ID,
    action: str = Path(pattern=r"^(load|unload)$"),
) -> dict[str, Any]:
    """Load a model onto a worker, or unload it everywhere (admin key required when set)."""
    ctx = _ctx(request)
    ctx.auth.require_admin(request)
    if model_id not in ctx.runtime.specs:
        raise unknown_model(model_id)
    runtime: Runtime = ctx.runtime
    t0 = time.monotonic()
    try:
        results = await asyncio.to_thread(runtime.call_on_workers, model_id, action)
    except Exception as exc:
        raise APIError(409, f"{action} failed: {exc}", code=f"{action}_failed") from None
    return {"model": model_id, "action": action, "results": results,
            "seconds": round(time.monotonic() - t0, 3)}


