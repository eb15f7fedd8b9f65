"""The OpenAI-compatible surface: chat completions, completions, embeddings, models list;
each also at llama-server's path without ``/v1`` but completions, whose ``/completions`` is
llama-server's native completion (``routes.llama_server``)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from sluice.server.core import (
    ChatPrompt,
    ServeRequest,
    TextPrompt,
    TokenPrompt,
    decision_headers,
    embed_inputs,
    embedded,
    embedding_spec,
    model_list,
    model_name,
    open_generation,
    spec_of_kind,
    tokenizer_of,
)
from sluice.server.core.prefill import CONTENT_PART_SEPARATOR, continues_final
from sluice.server.core.reasoning import ThinkingAsk
from sluice.server.errors import bad_param, unknown_model
from sluice.server.params import body_constraint, sampling_kwargs, tool_plan
from sluice.server.routes.common import (
    ERROR_RESPONSES,
    Tenant,
    body_headers,
    ctx_of,
    one_shot,
    run_generative,
)
from sluice.server.schemas.openai import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from sluice.server.shapes.base import TokenText
from sluice.server.shapes.chat import ChatShape
from sluice.server.shapes.completion import CompletionShape

router = APIRouter(tags=["openai"])


@router.post("/v1/chat/completions", responses=ERROR_RESPONSES)
@router.post("/chat/completions", include_in_schema=False)
async def chat_completions(
    body: ChatCompletionRequest, request: Request, tenant: Tenant
) -> Response:
    """OpenAI chat completions; ``stream`` gives SSE chunks ending with ``[DONE]``. Tools
    are rendered with the model's template (or the generic format) and calls parsed from
    the output; ``response_format`` and required calls constrain decoding."""
    ctx = ctx_of(request)
    headers = body_headers(request, body)
    model = model_name(ctx, body.model)
    spec_of_kind(ctx, model, "generative")
    tok = tokenizer_of(ctx, model)
    plan = tool_plan(body)
    constraint, param = ((plan.constraint, "tools") if plan.constraint is not None
                         else body_constraint(body))
    gen = await open_generation(ctx, request.headers, tenant, ServeRequest(
        model, chat_prompt(body, plan.tools),
        sampling=sampling_kwargs(body, tok),
        max_tokens=body.max_completion_tokens or body.max_tokens,
        constraint=constraint, constraint_param=param,
        priority=body.priority, deadline_ms=body.deadline_ms,
        thinking=ThinkingAsk.of(effort=body.reasoning_effort, enabled=body.enable_thinking(),
                                budget_tokens=body.thinking_budget_tokens),
        report_progress=body.stream and body.return_progress,
        names=("messages", "max_completion_tokens" if body.max_completion_tokens
               else "max_tokens")))
    shape = ChatShape(f"chatcmpl-{gen.request.request_id}", model,
                      tokens=TokenText(tok) if body.logprobs else None, tool_names=plan.names,
                      thinking=gen.thinking, request=gen.request)
    if ctx.config.server.verbose_answers if body.verbose is None else body.verbose:
        shape.verbose = {"prompt": b"".join(tok.token_bytes(t) for t in gen.request.prompt_tokens
                                            ).decode("utf-8", "replace")}
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return await run_generative(request, gen, shape, stream=body.stream,
                                include_usage=include_usage, headers=headers,
                                keep_events=bool(body.logprobs))


def chat_prompt(body: ChatCompletionRequest, tools: Sequence[Mapping[str, Any]]) -> ChatPrompt:
    """The body's conversation with ``tools`` offered; a final assistant turn to continue
    (``core.prefill``) becomes its continuation, else ``add_generation_prompt`` false
    leaves the assistant turn's opening out."""
    messages = body.messages
    if continues_final([m.as_dict() for m in messages[-2:]],
                       continue_final_message=body.continue_final_message,
                       add_generation_prompt=body.add_generation_prompt):
        return ChatPrompt([m.as_dict() for m in messages[:-1]], tools,
                          continuation=messages[-1].text(CONTENT_PART_SEPARATOR))
    return ChatPrompt([m.as_dict() for m in messages], tools,
                      add_generation_prompt=body.add_generation_prompt is not False)


@router.post("/v1/completions", responses=ERROR_RESPONSES)
async def completions(body: CompletionRequest, request: Request, tenant: Tenant) -> Response:
    """OpenAI text completions (one prompt per request); ``echo`` puts the prompt first,
    with its logprobs when ``logprobs`` is set."""
    headers = body_headers(request, body)
    ctx = ctx_of(request)
    model = model_name(ctx, body.model)
    spec = spec_of_kind(ctx, model, "generative")
    tok = tokenizer_of(ctx, model)
    want_logprobs = body.logprobs is not None
    if body.echo and want_logprobs and body.stream:
        raise bad_param("echo", "echo with logprobs is only available without stream "
                                "(the prompt's logprobs arrive with the last token)")
    constraint, param = body_constraint(body)
    prompt = body.prompt
    text = prompt if isinstance(prompt, str) else (prompt[0] if isinstance(prompt[0], str)
                                                    else None)
    gen = await open_generation(ctx, request.headers, tenant, ServeRequest(
        model,
        TextPrompt(text) if text is not None else TokenPrompt([int(t) for t in prompt]),
        sampling=sampling_kwargs(body, tok), max_tokens=body.max_tokens or None,
        # OpenAI's 16, unless the model sets its own (llama-server's --n-predict)
        default_max_tokens=None if spec.default_max_tokens is not None else 16,
        constraint=constraint, constraint_param=param, priority=body.priority,
        deadline_ms=body.deadline_ms, names=("prompt", "max_tokens")))
    req = gen.request
    echo = None
    if body.echo:
        echo = text if text is not None else b"".join(
            tok.token_bytes(t) for t in req.prompt_tokens).decode("utf-8", "replace")
    shape = CompletionShape(f"cmpl-{req.request_id}", model,
                            tokens=TokenText(tok) if want_logprobs else None, echo=echo,
                            prompt_ids=req.prompt_tokens, request=req)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return await run_generative(request, gen, shape, stream=body.stream,
                                include_usage=include_usage, headers=headers,
                                keep_events=want_logprobs)


def _encode(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
    return vector


@router.post("/v1/embeddings", responses=ERROR_RESPONSES)
@router.post("/embeddings", include_in_schema=False)
async def embeddings(body: EmbeddingRequest, request: Request, tenant: Tenant) -> Response:
    """OpenAI embeddings from an embedding model, or a generative one started with
    embeddings on."""
    headers = body_headers(request, body)
    model = model_name(ctx_of(request), body.model)
    embedder = embedding_spec(ctx_of(request), model).model_id
    inputs = embed_inputs(body.input)
    finals, reqs = await one_shot(request, embedder, tenant, inputs, body.priority,
                                  body.deadline_ms)
    vectors, n_tokens = embedded(finals)
    payload = {
        "object": "list",
        "data": [{"object": "embedding", "index": i,
                  "embedding": _encode(v, body.encoding_format)}
                 for i, v in enumerate(vectors)],
        "model": model,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    }
    return JSONResponse(payload, headers={**decision_headers(reqs[-1]), **headers})


@router.get("/v1/models", responses={401: {"description": "bad key"}})
@router.get("/models", include_in_schema=False)
async def list_models(request: Request, tenant: Tenant) -> dict[str, Any]:
    """Configured models, with where each is resident; a generative model's capabilities
    (``chat`` only where it has a chat template) and sampling defaults."""
    return {"object": "list", "data": await asyncio.to_thread(model_list, ctx_of(request))}


@router.get("/v1/models/{model_id:path}", responses={401: {"description": "bad key"},
                                                     404: {"description": "unknown model"}})
async def get_model(model_id: str, request: Request, tenant: Tenant) -> dict[str, Any]:
    """One model, as listed (404 ``model_not_found`` if it is not configured)."""
    for entry in await asyncio.to_thread(model_list, ctx_of(request)):
        if entry["id"] == model_id:
            return entry
    raise unknown_model(model_id)
