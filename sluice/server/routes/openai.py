"""The OpenAI-compatible surface: chat completions, completions, embeddings, models list."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from sluice.server.routes.common import (
    ERROR_RESPONSES,
    Tenant,
    ctx_of,
    decision_headers,
    embedding_spec,
    generative_request,
    model_list,
    one_shot,
    run_generative,
    spec_of_kind,
    tokenizer_of,
)
from sluice.server.schemas import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from sluice.server.shapes import ChatShape, CompletionShape

router = APIRouter(tags=["openai"])


def _sampling(body: ChatCompletionRequest | CompletionRequest) -> dict[str, Any]:
    return {
        "temperature": body.temperature,
        "top_p": body.top_p,
        "top_k": body.top_k,
        "seed": body.seed,
        "stop": body.stop_list(),
        "ignore_eos": body.ignore_eos,
    }


@router.post("/v1/chat/completions", responses=ERROR_RESPONSES)
async def chat_completions(
    body: ChatCompletionRequest, request: Request, tenant: Tenant
) -> Response:
    """OpenAI chat completions; ``stream`` gives SSE chunks ending with ``[DONE]``."""
    ctx = ctx_of(request)
    spec_of_kind(ctx, body.model, "generative")
    tok = tokenizer_of(ctx, body.model)
    prompt = tok.render_chat([{"role": m.role, "content": m.text()} for m in body.messages])
    req = await generative_request(
        ctx, request.headers, body.model, tenant, text=prompt, token_ids=None,
        max_tokens=body.max_completion_tokens or body.max_tokens, params=_sampling(body),
        priority=body.priority, deadline_ms=body.deadline_ms,
        names=("messages", "max_completion_tokens" if body.max_completion_tokens
               else "max_tokens"),
    )
    shape = ChatShape(f"chatcmpl-{req.request_id}", body.model)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return await run_generative(request, req, shape, stream=body.stream,
                                include_usage=include_usage)


@router.post("/v1/completions", responses=ERROR_RESPONSES)
async def completions(body: CompletionRequest, request: Request, tenant: Tenant) -> Response:
    """OpenAI text completions (one prompt per request)."""
    prompt = body.prompt
    text = prompt if isinstance(prompt, str) else (prompt[0] if isinstance(prompt[0], str)
                                                    else None)
    ids = None if text is not None else [int(t) for t in prompt]
    req = await generative_request(
        ctx_of(request), request.headers, body.model, tenant, text=text, token_ids=ids,
        max_tokens=body.max_tokens or 16, params=_sampling(body),
        priority=body.priority, deadline_ms=body.deadline_ms, names=("prompt", "max_tokens"),
    )
    shape = CompletionShape(f"cmpl-{req.request_id}", body.model)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return await run_generative(request, req, shape, stream=body.stream,
                                include_usage=include_usage)


def _encode(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
    return vector


@router.post("/v1/embeddings", responses=ERROR_RESPONSES)
async def embeddings(body: EmbeddingRequest, request: Request, tenant: Tenant) -> Response:
    """OpenAI embeddings for one-shot embedding models."""
    embedding_spec(ctx_of(request), body.model)
    inputs = [body.input] if isinstance(body.input, str) else list(body.input)
    finals, reqs = await one_shot(request, body.model, tenant, inputs, body.priority,
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
    return JSONResponse(payload, headers=decision_headers(reqs[-1]))


@router.get("/v1/models", responses={401: {"description": "bad key"}})
async def list_models(request: Request, tenant: Tenant) -> dict[str, Any]:
    """Configured models, with where each is resident."""
    return {"object": "list", "data": model_list(ctx_of(request))}
