"""Anthropic Messages: ``POST /v1/messages`` (one ``message``, or Anthropic's event stream)
and ``POST /v1/messages/count_tokens``. The key comes as ``x-api-key`` or ``Authorization:
Bearer``; ``anthropic-version`` is accepted whatever its value; errors are in Anthropic's
shape and status codes (``errors.error_response``: overload is 529 ``overloaded_error``,
quota 429 ``rate_limit_error``, both with ``retry-after``)."""

from __future__ import annotations

import asyncio
import json

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from sluice.backends.base import Tokenizer
from sluice.backends.chat import chat_tokens
from sluice.engine.request import Constraint
from sluice.server.anthropic.schemas import CountTokensRequest, MessagesRequest
from sluice.server.anthropic.translate import (
    MessageRenderer,
    chat_prompt,
    thinking_ask,
    thinking_enabled,
    tool_plan,
)
from sluice.server.core import (
    ServeRequest,
    check_prompt_length,
    model_name,
    open_generation,
    rendered_chat,
    spec_of_kind,
    tokenizer_of,
)
from sluice.server.core.output import OutputSplitter
from sluice.server.params import sent_sampling
from sluice.server.routes.common import (
    ERROR_RESPONSES,
    Tenant,
    body_headers,
    ctx_of,
    run_output,
)

router = APIRouter(tags=["anthropic"])
RESPONSES = {**ERROR_RESPONSES, 529: {"description": "overloaded (Anthropic's status)"}}


@router.post("/v1/messages", responses=RESPONSES)
async def messages(body: MessagesRequest, request: Request, tenant: Tenant) -> Response:
    """Anthropic's Messages API: text, ``tool_use`` and ``tool_result`` blocks, tools with
    ``tool_choice`` (a forced call is constrained to its ``input_schema``), structured
    output (``output_config.format``), stop sequences; ``stream`` gives Anthropic's
    events."""
    ctx = ctx_of(request)
    headers = body_headers(request, body)
    model = model_name(ctx, body.model)
    spec_of_kind(ctx, model, "generative")
    plan = tool_plan(body)
    constraint, param = plan.constraint, "tools"
    fmt = body.output_config.format if body.output_config else None
    if constraint is None and fmt is not None:
        constraint = Constraint("json_schema", spec=json.dumps(fmt.schema_))
        param = "output_config.format"
    gen = await open_generation(ctx, request.headers, tenant, ServeRequest(
        model, chat_prompt(body, plan.tools),
        sampling={**sent_sampling(body), "stop": tuple(body.stop_sequences or ())},
        max_tokens=body.max_tokens, constraint=constraint, constraint_param=param,
        priority=body.priority, deadline_ms=body.deadline_ms, thinking=thinking_ask(body)))
    renderer = MessageRenderer(f"msg_{gen.request.request_id}", model,
                               len(gen.request.prompt_tokens))
    return await run_output(request, gen, OutputSplitter(plan.names, gen.thinking), renderer,
                            stream=body.stream, headers=headers)


def _count(tok: Tokenizer, body: CountTokensRequest, model: str) -> int:
    """The tokens of the prompt ``messages`` runs: its conversation, tools and the
    template's ``enable_thinking`` (``thinking_enabled``, as ``thinking_ask`` has it)."""
    prompt = rendered_chat(tok, chat_prompt(body, tool_plan(body).tools), model,
                           enable_thinking=thinking_enabled(body))
    check_prompt_length(tok, prompt.text, "messages", whole_context=True)
    return len(chat_tokens(tok, prompt))


@router.post("/v1/messages/count_tokens", responses=RESPONSES)
async def count_tokens(body: CountTokensRequest, request: Request,
                       tenant: Tenant) -> JSONResponse:
    """The prompt tokens a Messages request with this conversation, system, tools and
    ``thinking`` would run (its ``usage.input_tokens``); one request against the tenant's
    request rate, charged before anything is tokenized."""
    ctx = ctx_of(request)
    headers = body_headers(request, body)
    model = model_name(ctx, body.model)
    spec_of_kind(ctx, model, "generative")
    tok = tokenizer_of(ctx, model)
    await ctx.quota.charge_call(tenant.id, "count_tokens")
    n = await asyncio.to_thread(_count, tok, body, model)
    return JSONResponse({"input_tokens": n}, headers=headers)
