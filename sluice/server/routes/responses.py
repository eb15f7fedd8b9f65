"""OpenAI Responses, stateless: ``POST /v1/responses`` (one ``response`` object, or the
typed event stream the ``openai`` SDK reads). Nothing is stored: ``store`` is reported
false and ``previous_response_id``, ``conversation`` and ``background`` are a 400; errors
are OpenAI's shape, as on the other OpenAI routes."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from sluice.backends.base import Tokenizer
from sluice.backends.chat import chat_tokens
from sluice.server.core import (
    ChatPrompt,
    ServeRequest,
    model_name,
    open_generation,
    rendered_chat,
    spec_of_kind,
    tokenizer_of,
)
from sluice.server.core.output import OutputSplitter
from sluice.server.core.prompt import check_prompt_length
from sluice.server.core.reasoning import ThinkingAsk
from sluice.server.params import sent_sampling
from sluice.server.responses.schemas import ResponsesRequest
from sluice.server.responses.translate import (
    ResponseRenderer,
    chat_messages,
    format_of,
    refuse_stateful,
    tool_plan,
)
from sluice.server.routes.common import (
    ERROR_RESPONSES,
    Tenant,
    body_headers,
    ctx_of,
    run_output,
)

router = APIRouter(tags=["openai"])


@router.post("/v1/responses", responses=ERROR_RESPONSES)
@router.post("/responses", include_in_schema=False)
async def responses(body: ResponsesRequest, request: Request, tenant: Tenant) -> Response:
    """OpenAI Responses: ``input`` as text or items (messages, ``function_call``,
    ``function_call_output``), ``instructions``, function tools with ``tool_choice``,
    ``text.format`` (``json_schema``, ``json_object``) on the constraint engine. Also at
    llama-server's path without ``/v1``; ``model`` left out: the default model."""
    ctx = ctx_of(request)
    headers = body_headers(request, body)
    refuse_stateful(body)
    model = model_name(ctx, body.model)
    spec_of_kind(ctx, model, "generative")
    plan = tool_plan(body)
    constraint, param = ((plan.constraint, "tools") if plan.constraint is not None
                         else (format_of(body), "text.format"))
    gen = await open_generation(ctx, request.headers, tenant, ServeRequest(
        model, ChatPrompt(chat_messages(body), plan.tools),
        sampling={**sent_sampling(body),
                  "seed": None if body.seed is None else body.seed % 2**64},
        max_tokens=body.max_output_tokens, constraint=constraint, constraint_param=param,
        priority=body.priority, deadline_ms=body.deadline_ms,
        thinking=ThinkingAsk.of(effort=body.reasoning.effort if body.reasoning else None,
                                budget_tokens=body.thinking_budget_tokens),
        report_progress=body.stream and body.return_progress,
        names=("input", "max_output_tokens")))
    renderer = ResponseRenderer(f"resp_{gen.request.request_id:024x}", body, model,
                                gen.request, ctx.runtime.clock)
    return await run_output(request, gen, OutputSplitter(plan.names, gen.thinking), renderer,
                            stream=body.stream, headers=headers)


@router.post("/v1/responses/input_tokens", responses=ERROR_RESPONSES)
@router.post("/responses/input_tokens", include_in_schema=False)
async def input_tokens(body: ResponsesRequest, request: Request, tenant: Tenant) -> JSONResponse:
    """OpenAI's input token count of a Responses request (``input``, ``instructions``,
    ``tools``): the prompt tokens it would run; one request against the tenant's request
    rate, charged before anything is tokenized."""
    ctx = ctx_of(request)
    headers = body_headers(request, body)
    model = model_name(ctx, body.model)
    spec_of_kind(ctx, model, "generative")
    tok = tokenizer_of(ctx, model)
    await ctx.quota.charge_call(tenant.id, "input_tokens")
    prompt = ChatPrompt(chat_messages(body), tool_plan(body).tools)
    n = await asyncio.to_thread(_count, tok, prompt, model)
    return JSONResponse({"object": "response.input_tokens", "input_tokens": n},
                        headers=headers)


def _count(tok: Tokenizer, prompt: ChatPrompt, model: str) -> int:
    rendered = rendered_chat(tok, prompt, model, "input")
    check_prompt_length(tok, rendered.text, "input", whole_context=True)
    return len(chat_tokens(tok, rendered))
