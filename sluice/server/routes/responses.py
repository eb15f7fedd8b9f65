"""OpenAI Responses, stateless: ``POST /v1/responses`` (one ``response`` object, or the
typed event stream the ``openai`` SDK reads). Nothing is stored: ``store`` is reported
false and ``previous_response_id``, ``conversation`` and ``background`` are a 400; errors
are OpenAI's shape, as on the other OpenAI routes."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from sluice.server.core import (
    ChatPrompt,
    ServeRequest,
    model_name,
    open_generation,
    spec_of_kind,
)
from sluice.server.core.output import OutputSplitter
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
async def responses(body: ResponsesRequest, request: Request, tenant: Tenant) -> Response:
    """OpenAI Responses: ``input`` as text or items (messages, ``function_call``,
    ``function_call_output``), ``instructions``, function tools with ``tool_choice``,
    ``text.format`` (``json_schema``, ``json_object``) on the constraint engine."""
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
        names=("input", "max_output_tokens")))
    renderer = ResponseRenderer(f"resp_{gen.request.request_id:024x}", body, model)
    return await run_output(request, gen, OutputSplitter(plan.names, gen.thinking), renderer,
                            stream=body.stream, headers=headers)
