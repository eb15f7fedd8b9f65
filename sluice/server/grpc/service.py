"""``sluice.v1.Inference`` on ``grpc.aio``: the HTTP layer's code paths with gRPC at the edges.

Per call: the metadata is the headers (``authorization`` → tenant through ``Auth``;
``x-sluice-priority`` as over HTTP); the body is validated by the same pydantic models as the
HTTP bodies (field names match, so an error names the same field); requests are built,
admitted (tenant quota, then runtime admission) and awaited by the serving core
(``sluice.server.core``), as the HTTP routes' are.
The gRPC deadline is the request's sluice deadline: the time remaining when the call arrives
becomes ``deadline_ms``, exactly like the body field over HTTP. Every ``APIError`` aborts the
call with the status of ``sluice.server.grpc.errors``.

A call the client cancels (or whose deadline passes) is cancelled by grpc.aio, which cancels
the handler task: its requests are cancelled in turn and free their KV blocks at the next
step. Past the deadline they are left to expire on their own, so they count as expired.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import grpc
from pydantic import BaseModel, ValidationError

from sluice.config import TenantConfig
from sluice.engine.bridge import AsyncHandle
from sluice.engine.request import Final, RequestStatus, TokenEvent
from sluice.engine.request import Request as RtRequest
from sluice.server import access
from sluice.server.context import AppContext
from sluice.server.core import (
    ChatPrompt,
    ServeRequest,
    TextPrompt,
    admit,
    check_text_input,
    embed_inputs,
    embedded,
    embedding_spec,
    final_api_error,
    model_list,
    one_shot_requests,
    open_generation,
    spec_of_kind,
)
from sluice.server.errors import APIError, bad_param, validation_error
from sluice.server.grpc.errors import grpc_error
from sluice.server.middleware import request_id_from
from sluice.server.params import sent_sampling
from sluice.server.schemas.native import InferRequest
from sluice.server.schemas.openai import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from sluice.v1 import inference_pb2 as pb
from sluice.v1 import inference_pb2_grpc as pb_grpc

log = logging.getLogger("sluice.grpc")
Context = grpc.aio.ServicerContext[Any, Any]
"""A call's server-side context (any request and response type)."""


def metadata_headers(context: Context) -> dict[str, str]:
    """The call's text metadata as lower-case headers (binary ``-bin`` entries left out)."""
    return {k.lower(): v for k, v in (context.invocation_metadata() or ())
            if isinstance(v, str)}


def deadline_ms(context: Context) -> float | None:
    """The call's gRPC deadline as sluice's ``deadline_ms`` (None: the call has none)."""
    remaining_s = context.time_remaining()
    if remaining_s is None:
        return None
    if remaining_s <= 0:
        raise APIError(504, "The call's deadline passed before it was admitted",
                       type="deadline_exceeded", code="deadline")
    return remaining_s * 1000.0


def validated(model: type[BaseModel], data: dict[str, Any]) -> Any:
    """``data`` through the HTTP layer's pydantic model; an invalid field is an
    ``APIError`` naming it (INVALID_ARGUMENT)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(list(exc.errors())) from None


class _Call:
    """One RPC's edges: its metadata, request id (echoed in the initial metadata), access
    line, and the mapping of an ``APIError`` to the call's status."""

    def __init__(self, ctx: AppContext, context: Context, method: str) -> None:
        self.ctx = ctx
        self.context = context
        self.headers = metadata_headers(context)
        self.request_id = request_id_from(self.headers.get("x-request-id"))
        self.record = access.begin(self.request_id, "grpc", "POST",
                                   f"/sluice.v1.Inference/{method}")
        self.status = "OK"

    async def __aenter__(self) -> _Call:
        await self.context.send_initial_metadata((("x-request-id", self.request_id),))
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: Any) -> None:
        try:
            if isinstance(exc, Exception) and not isinstance(exc, APIError | grpc.aio.AbortError):
                # A bug, not an outcome: logged here, and the client gets INTERNAL with
                # nothing internal in it (as HTTP's 500).
                log.error("unhandled error in call %s", self.request_id, exc_info=exc)
                exc = APIError(500, "Internal error.", type="server_error",
                               code="internal_error")
            if isinstance(exc, APIError):
                rich = grpc_error(exc)
                self.status = rich.code.name
                await self.context.abort(rich.code, rich.message, rich.trailing_metadata())
            elif isinstance(exc, asyncio.CancelledError):
                remaining = self.context.time_remaining()
                self.status = ("DEADLINE_EXCEEDED" if remaining is not None and remaining <= 0
                               else "CANCELLED")
            elif exc is not None and not isinstance(exc, Exception):
                self.status = "CANCELLED"
        finally:
            access.emit(self.record, self.status,
                        log_content=self.ctx.config.server.log_content)


def decision(req: RtRequest) -> pb.Decision:
    """What the runtime decided for ``req`` (HTTP's ``x-sluice-*`` headers)."""
    out = pb.Decision(request_id=str(req.request_id), tenant=req.tenant_id,
                      variant=req.variant or "", route=req.route_reason[:200])
    if req.worker_id is not None:
        out.worker = req.worker_id
    if req.predicted_wait_s is not None:
        out.predicted_wait_ms = req.predicted_wait_s * 1000.0
    t = req.times
    if t.started_s is not None and t.queued_s is not None:
        out.queue_wait_ms = (t.started_s - t.queued_s) * 1000.0
    return out


def usage(prompt_tokens: int, completion_tokens: int) -> pb.Usage:
    return pb.Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                    total_tokens=prompt_tokens + completion_tokens)


class InferenceService(pb_grpc.InferenceServicer):
    """The four RPCs of ``sluice.v1.Inference`` over one ``AppContext``."""

    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx

    def _tenant(self, headers: Mapping[str, str]) -> TenantConfig:
        return self.ctx.auth.tenant_from_headers(headers)

    def _settle(self, handles: list[AsyncHandle], context: Context) -> None:
        """Called when the handler ends: requests still running are cancelled, unless the
        deadline passed (then they expire and count as expired)."""
        remaining = context.time_remaining()
        if remaining is not None and remaining <= 0:
            return
        for h in handles:
            if h.final is None:
                h.cancel()

    async def Generate(self, request: pb.GenerateRequest,
                       context: Context) -> AsyncIterator[pb.GenerateResponse]:
        handles: list[AsyncHandle] = []
        async with _Call(self.ctx, context, "Generate") as call:
            try:
                tenant = self._tenant(call.headers)
                ask = self._generative(request, deadline_ms(context))
                gen = await open_generation(self.ctx, call.headers, tenant, ask)
                req = gen.request
                handles = [gen.handle]
                async for event in gen.events():
                    if isinstance(event, Final):
                        if event.status != RequestStatus.COMPLETED:
                            raise final_api_error(event)
                        yield pb.GenerateResponse(done=pb.Done(
                            finish_reason=event.finish_reason,
                            usage=usage(event.prompt_tokens, event.completion_tokens),
                            decision=decision(req)))
                        return
                    if not isinstance(event, TokenEvent):
                        continue  # prompt progress (never asked for here)
                    yield pb.GenerateResponse(token=pb.Token(
                        index=event.index, token_id=event.token_id, text=event.text))
            finally:
                self._settle(handles, context)

    def _generative(self, request: pb.GenerateRequest, deadline: float | None) -> ServeRequest:
        """The core's request for a ``GenerateRequest``, validated as the HTTP bodies are:
        ``messages`` as a chat completion, ``prompt`` as a completion."""
        fields: dict[str, Any] = {"model": request.model, "ignore_eos": request.ignore_eos}
        if request.top_k:  # proto3 has no presence for it: 0 is the model's default
            fields["top_k"] = request.top_k
        for name in ("max_tokens", "temperature", "top_p", "seed"):
            if request.HasField(name):
                fields[name] = getattr(request, name)
        if request.stop:
            fields["stop"] = list(request.stop)
        which = request.WhichOneof("input")
        if which is None:
            raise bad_param("prompt", "One of prompt or messages is required")
        if which == "messages":
            body = validated(ChatCompletionRequest, {**fields, "messages": [
                {"role": m.role, "content": m.content} for m in request.messages.messages]})
            # rendered by the core as HTTP chat is: user text tokenized as plain text,
            # never as the template's control tokens
            prompt: ChatPrompt | TextPrompt = ChatPrompt([m.as_dict() for m in body.messages])
            names = ("messages", "max_tokens")
        else:
            body = validated(CompletionRequest, {**fields, "prompt": request.prompt})
            prompt, names = TextPrompt(request.prompt), ("prompt", "max_tokens")
        return ServeRequest(
            body.model, prompt, max_tokens=body.max_tokens,
            sampling={**sent_sampling(body), "seed": body.seed, "stop": body.stop_list(),
                      "ignore_eos": body.ignore_eos},
            deadline_ms=deadline, names=names)

    async def _one_shot(self, call: _Call, tenant: TenantConfig, model: str,
                        inputs: list[Any]) -> tuple[list[Final], list[RtRequest]]:
        """Admit one request per input and await them all; cancelled with the call."""
        reqs = one_shot_requests(self.ctx, call.headers, model, tenant, inputs, None,
                                 deadline_ms(call.context))
        handles = await admit(self.ctx, reqs)
        try:
            finals = await asyncio.gather(*(h.result() for h in handles))
        finally:
            self._settle(handles, call.context)
        for final in finals:
            if final.status != RequestStatus.COMPLETED:
                raise final_api_error(final)
        return list(finals), reqs

    async def Infer(self, request: pb.InferRequest, context: Context) -> pb.InferResponse:
        async with _Call(self.ctx, context, "Infer") as call:
            tenant = self._tenant(call.headers)  # the key before the model: no enumeration
            body = validated(InferRequest, {"model": request.model, "input": request.input})
            check_text_input(spec_of_kind(self.ctx, body.model, "oneshot"), body.model)
            [final], [req] = await self._one_shot(call, tenant, body.model, [body.input])
            out = pb.InferResponse(model=body.model, decision=decision(req))
            if isinstance(final.result, dict):
                scores = {str(k): float(v) for k, v in final.result.items()}
                out.classification.scores.update(scores)
                out.classification.label = max(scores, key=scores.__getitem__) if scores else ""
            else:
                [vector], _ = embedded([final])
                out.embedding.values.extend(float(x) for x in vector)
            return out

    async def Embed(self, request: pb.EmbedRequest, context: Context) -> pb.EmbedResponse:
        async with _Call(self.ctx, context, "Embed") as call:
            tenant = self._tenant(call.headers)  # the key before the model: no enumeration
            body = validated(EmbeddingRequest, {"model": request.model,
                                                "input": list(request.input)})
            embedder = embedding_spec(self.ctx, body.model).model_id
            finals, reqs = await self._one_shot(call, tenant, embedder,
                                                embed_inputs(body.input))
            vectors, n_tokens = embedded(finals)
            return pb.EmbedResponse(
                model=body.model,
                data=[pb.Embedding(values=[float(x) for x in v]) for v in vectors],
                usage=usage(n_tokens, 0), decision=decision(reqs[-1]))

    async def ListModels(self, request: pb.ListModelsRequest,
                         context: Context) -> pb.ListModelsResponse:
        async with _Call(self.ctx, context, "ListModels") as call:
            self._tenant(call.headers)
            return pb.ListModelsResponse(models=[
                pb.Model(id=m["id"], kind=m["kind"], task=m["task"] or "",
                         resident=bool(m.get("resident", False)),
                         resident_on=m.get("resident_on", []), status=m.get("status", ""),
                         variants=m.get("variants", []), policy=m.get("policy", ""))
                for m in await asyncio.to_thread(model_list, self.ctx)])
