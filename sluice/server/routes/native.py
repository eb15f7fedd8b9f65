"""sluice's native surface: ``/v1/infer``, any model, with tenant, priority and deadline."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from sluice.server.core import (
    ChatPrompt,
    ServeRequest,
    TextPrompt,
    check_text_input,
    decision_headers,
    open_generation,
)
from sluice.server.errors import APIError, bad_param, unknown_model
from sluice.server.params import sent_sampling
from sluice.server.routes.common import (
    ERROR_RESPONSES,
    Tenant,
    body_headers,
    ctx_of,
    one_shot,
    run_generative,
)
from sluice.server.schemas.native import InferRequest
from sluice.server.shapes.native import InferShape

router = APIRouter(tags=["native"])


@router.post("/v1/infer", responses=ERROR_RESPONSES)
async def infer(body: InferRequest, request: Request, tenant: Tenant) -> Response:
    """sluice's native endpoint: any model, with tenant, priority, deadline."""
    ctx = ctx_of(request)
    headers = body_headers(request, body)
    if body.tenant_id is not None and body.tenant_id != tenant.id:
        if ctx.auth.enabled:
            raise APIError(403, "tenant_id does not match the API key's tenant",
                           type="permission_error", param="tenant_id", code="tenant_mismatch")
        tenant = ctx.auth.named_tenant(body.tenant_id)
    spec = ctx.runtime.spec_for(body.model)
    if spec is None:
        raise unknown_model(body.model)
    if spec.kind == "oneshot":
        check_text_input(spec, body.model)
        if not isinstance(body.input, str):
            raise bad_param("input", "one-shot models take a text input")
        finals, reqs = await one_shot(request, body.model, tenant, [body.input], body.priority,
                                      body.deadline_ms)
        shape = InferShape(f"infer-{reqs[0].request_id}", body.model)
        return JSONResponse(shape.full(finals[0]),
                            headers={**decision_headers(reqs[0]), **headers})
    prompt = (TextPrompt(body.input) if isinstance(body.input, str)
              else ChatPrompt([m.as_dict() for m in body.input]))
    gen = await open_generation(ctx, request.headers, tenant, ServeRequest(
        body.model, prompt, max_tokens=body.max_new_tokens,
        sampling={**sent_sampling(body), "seed": None if body.seed is None else body.seed % 2**64,
                  "stop": tuple(body.stop or ())},
        priority=body.priority, deadline_ms=body.deadline_ms,
        names=("input", "max_new_tokens")))
    shape = InferShape(f"infer-{gen.request.request_id}", body.model)
    return await run_generative(request, gen, shape, stream=body.stream, include_usage=True,
                                headers=headers)
