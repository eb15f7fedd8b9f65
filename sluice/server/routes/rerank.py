"""Rerank (``POST /v1/rerank``; llama-server's ``/rerank``, ``/v1/reranking`` and
``/reranking`` too): a query's documents scored by a one-shot ``rerank`` model, each
document a request of its own on the one-shot lane, so dynamic batching, quota, priority
and deadline apply to them as to embeddings. Errors are in OpenAI's shape."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from sluice.backends.base import RerankPair, RerankScore
from sluice.server.core import decision_headers, rerank_model
from sluice.server.rerank_wire import RerankRequest, rerank_body
from sluice.server.routes.common import ERROR_RESPONSES, Tenant, body_headers, ctx_of, one_shot

router = APIRouter(tags=["rerank"])


@router.post("/v1/rerank", responses={**ERROR_RESPONSES,
                                      501: {"description": "no model reranks"}})
@router.post("/rerank", include_in_schema=False)
@router.post("/v1/reranking", include_in_schema=False)
@router.post("/reranking", include_in_schema=False)
async def rerank(body: RerankRequest, request: Request, tenant: Tenant) -> Response:
    """The documents ranked by relevance to the query, highest first."""
    ctx = ctx_of(request)
    headers = body_headers(request, body)
    documents = body.document_texts(ctx.config.server.rerank_max_documents)  # 400 first
    model = rerank_model(ctx, body.model)
    pairs = [RerankPair(body.query, d) for d in documents]
    finals, reqs = await one_shot(request, model, tenant, list(pairs), body.priority,
                                  body.deadline_ms)
    scores = [RerankScore(*f.result) for f in finals]
    payload = rerank_body(body, model, reqs[0].request_id, documents, scores)
    return JSONResponse(payload, headers={**decision_headers(reqs[-1]), **headers})
