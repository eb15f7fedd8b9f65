"""Ollama's API (``/api/*``) on the serving core: chat and generate (NDJSON streams by
default, one object with ``stream: false``), embed, the model list, show, ps, version; every
error in Ollama's shape, ``{"error": "..."}``, with the status sluice's error has. Models
are named as on the other APIs (``model_name``: aliases, ``name:latest`` for ``name``);
answers echo the name the client sent, as Ollama's do.

``keep_alive`` goes to the model lifecycle (``sluice.policy.capacity.keep_alive``): a chat without
messages or a generate without a prompt loads the model (``done_reason: "load"``), or with
``keep_alive: 0`` unloads it (``"unload"``). Models are configured, not pulled: ``/api/pull``,
``/api/create``, ``/api/delete``, ``/api/copy`` and ``/api/push`` answer 501 naming the sluice
way.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError

import sluice
from sluice.backends.base import EmbedInput
from sluice.backends.chat import parse_tool_calls
from sluice.engine.request import Final, PromptProgress, RequestStatus, TokenEvent
from sluice.server import ollama_wire as wire
from sluice.server.core import (
    ChatPrompt,
    Generation,
    ServeRequest,
    TextPrompt,
    decision_headers,
    embed_inputs,
    embedded,
    embedding_spec,
    final_api_error,
    model_name,
    open_generation,
    spec_of_kind,
    tokenizer_of,
)
from sluice.server.errors import APIError, bad_param, ollama_response, validation_error
from sluice.server.lifecycle import loaded_models
from sluice.server.routes.common import (
    ERROR_RESPONSES,
    IGNORED_HEADER,
    ctx_of,
    one_shot,
    race_disconnect,
)

router = APIRouter(tags=["ollama"])
NDJSON = "application/x-ndjson"
_STARTED_UNIX = time.time()
Body = TypeVar("Body", bound=BaseModel)


async def _answer(request: Request, handler: Callable[[Request], Awaitable[Response]]
                  ) -> Response:
    try:
        return await handler(request)
    except APIError as err:
        return ollama_response(err)


async def _body(request: Request, model: type[Body]) -> Body:
    """The JSON body as ``model`` (400 in the API's words when it is not)."""
    raw = await request.body()
    try:
        data = json.loads(raw or b"{}")
    except (ValueError, RecursionError):
        raise APIError(400, "Request body is not valid JSON", code="invalid_json") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(list(exc.errors())) from None


def _headers(body: BaseModel) -> dict[str, str]:
    names = wire.ignored(body)
    return {IGNORED_HEADER: ",".join(n[:64] for n in names[:32])} if names else {}


def _line(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode() + b"\n"


# -- chat and generate ------------------------------------------------------------------


async def _lifecycle_only(request: Request, body: wire.ChatRequest | wire.GenerateRequest,
                          field: str) -> Response:
    """No messages / no prompt: load the model, or unload it with ``keep_alive: 0``."""
    ctx = ctx_of(request)
    ctx.auth.tenant(request)
    model = model_name(ctx, body.model)
    spec_of_kind(ctx, model, "generative")
    keep = wire.keep_alive_of(body.keep_alive)
    unload = keep is not None and keep.idle_s == 0
    try:
        await asyncio.to_thread(ctx.runtime.call_on_workers, model,
                                "unload" if unload else "load")
    except RuntimeError as exc:
        raise APIError(503, f"model '{body.model}' could not be "
                            f"{'unloaded' if unload else 'loaded'}: {exc}",
                       type="server_overloaded", code="model_busy" if unload
                       else "model_load_failed") from None
    payload: dict[str, Any] = {"model": body.model, "created_at": wire.created_at(),
                               "done": True, "done_reason": "unload" if unload else "load"}
    payload[field] = {"role": "assistant", "content": ""} if field == "message" else ""
    return JSONResponse(payload)


async def _chat(request: Request) -> Response:
    body = await _body(request, wire.ChatRequest)
    if not body.messages:
        return await _lifecycle_only(request, body, "message")
    images = [i for m in body.messages for i in (m.images or [])]
    wire.refuse_unsupported(body, images)
    tools = [t.as_dict() for t in body.tools or []]
    names = [t.function.name for t in body.tools or []]
    return await _generate(request, body, ChatPrompt(wire.openai_messages(body.messages), tools),
                           "message", names)


async def _generate_text(request: Request) -> Response:
    body = await _body(request, wire.GenerateRequest)
    if not body.prompt and body.suffix is None:
        return await _lifecycle_only(request, body, "response")
    wire.refuse_unsupported(body, body.images)
    if body.suffix is not None:
        raise APIError(400, f"model '{body.model}' does not support insert (suffix)",
                       param="suffix", code="invalid_value")
    if body.template is not None:
        raise APIError(400, "template overrides are not supported: the model's own chat "
                            "template is used (raw: true sends the prompt as it is)",
                       param="template", code="invalid_value")
    if body.raw:
        prompt: TextPrompt | ChatPrompt = TextPrompt(body.prompt)
    else:
        turns = ([{"role": "system", "content": body.system}] if body.system else [])
        prompt = ChatPrompt([*turns, {"role": "user", "content": body.prompt}])
    return await _generate(request, body, prompt, "response", [])


async def _generate(request: Request, body: wire.ChatRequest | wire.GenerateRequest,
                    prompt: TextPrompt | ChatPrompt, field: str, tools: list[str]) -> Response:
    """Admit through the core and answer in Ollama's shape (``field``: ``message`` for chat,
    ``response`` for generate)."""
    ctx = ctx_of(request)
    tenant = ctx.auth.tenant(request)
    model = model_name(ctx, body.model)
    spec_of_kind(ctx, model, "generative")
    tok = tokenizer_of(ctx, model)
    options = body.options or wire.Options()
    gen = await open_generation(ctx, request.headers, tenant, ServeRequest(
        model, prompt, sampling=wire.sampling(options),
        max_tokens=None if options.num_predict is None or options.num_predict < 0
        else options.num_predict,
        default_max_tokens=tok.n_ctx_per_seq, context_tokens=options.num_ctx,
        fit_to_context=True,
        constraint=wire.format_constraint(body.format), constraint_param="format",
        keep_alive=wire.keep_alive_of(body.keep_alive),
        names=("messages" if field == "message" else "prompt", "options.num_predict")))
    headers = {**decision_headers(gen.request), **_headers(body)}
    if body.stream and not tools:
        return await _stream(request, gen, body.model, field, headers)
    final = await race_disconnect(request, _last(gen))
    if final is None:
        gen.cancel()
        return Response(status_code=499)
    if final.status != RequestStatus.COMPLETED:
        raise final_api_error(final)
    payload = _done(gen, final, body.model, field, final.text, tools)
    if body.stream:  # with tools: the one answer as the stream's only line
        return StreamingResponse(iter([_line(payload)]), media_type=NDJSON, headers=headers)
    return JSONResponse(payload, headers=headers)


async def _last(gen: Generation) -> Final | None:
    async for _ in gen.events():
        pass
    return gen.handle.final


def _done(gen: Generation, final: Final, model: str, field: str, text: str,
          tools: list[str]) -> dict[str, Any]:
    """The last object: the text (all of it, or none when streamed), counts and times."""
    payload: dict[str, Any] = {"model": model, "created_at": wire.created_at()}
    if field == "message":
        message: dict[str, Any] = {"role": "assistant", "content": text}
        parsed = parse_tool_calls(final.text, tools) if tools else None
        if parsed is not None:
            message["content"] = parsed[0]
            message["tool_calls"] = [
                {"function": {"name": c.name, "arguments": _arguments(c.arguments)}}
                for c in parsed[1]]
        payload["message"] = message
    else:
        payload["response"] = text
    payload.update(done=True, done_reason=wire.done_reason(final),
                   **wire.durations(gen.request.times, final.prompt_tokens,
                                    final.completion_tokens))
    if field == "response":
        payload["context"] = list(gen.request.prompt_tokens)
    return payload


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return {}


async def _stream(request: Request, gen: Generation, model: str, field: str,
                  headers: dict[str, str]) -> Response:
    """NDJSON: one object per piece of text, then the ``done`` object; a request that fails
    before its first token is an HTTP error, one that fails later ends with an error line."""
    events = gen.events().__aiter__()
    first = await race_disconnect(request, events.__anext__())
    if first is None:
        gen.cancel()
        return Response(status_code=499)
    if isinstance(first, Final) and first.status != RequestStatus.COMPLETED:
        raise final_api_error(first)

    def piece(text: str) -> dict[str, Any]:
        content: Any = {"role": "assistant", "content": text} if field == "message" else text
        return {"model": model, "created_at": wire.created_at(), field: content, "done": False}

    async def lines() -> AsyncIterator[bytes]:
        event: TokenEvent | PromptProgress | Final = first
        try:
            while True:
                if isinstance(event, Final):
                    if event.status == RequestStatus.COMPLETED:
                        yield _line(_done(gen, event, model, field, "", []))
                    else:
                        yield _line({"error": final_api_error(event).message})
                    return
                if isinstance(event, TokenEvent) and event.text:
                    yield _line(piece(event.text))
                event = await events.__anext__()
        finally:
            gen.cancel()

    return StreamingResponse(lines(), media_type=NDJSON, headers=headers)


@router.post("/api/chat", responses=ERROR_RESPONSES)
async def chat(request: Request) -> Response:
    """Ollama chat: ``messages``, ``tools``, ``format``, ``options``, ``stream``,
    ``keep_alive``."""
    return await _answer(request, _chat)


@router.post("/api/generate", responses=ERROR_RESPONSES)
async def generate(request: Request) -> Response:
    """Ollama generate: ``prompt`` (with ``system``, through the model's chat template unless
    ``raw``), ``format``, ``options``, ``stream``, ``keep_alive``."""
    return await _answer(request, _generate_text)


# -- embeddings -------------------------------------------------------------------------


async def _embed_inputs(request: Request, asked: str, inputs: list[str | EmbedInput],
                        keep_alive: float | str | None) -> tuple[list[list[float]], int, float]:
    """The vectors of ``inputs``, the tokens the model read for them, and the seconds the
    call took."""
    ctx = ctx_of(request)
    tenant = ctx.auth.tenant(request)
    model = model_name(ctx, asked)
    spec = ctx.runtime.spec_for(model)
    if spec is not None and spec.kind == "generative" and spec.embedding_model is None:
        raise APIError(400, f"model '{asked}' does not support embeddings (start it with "
                            f"--embedding, or [models.embeddings])", param="model",
                       code="model_kind_mismatch")
    embedder = embedding_spec(ctx, model).model_id
    started = time.monotonic()
    finals, _ = await one_shot(request, embedder, tenant, inputs, None, None,
                               wire.keep_alive_of(keep_alive))
    vectors, n_tokens = embedded(finals)
    return vectors, n_tokens, time.monotonic() - started


async def _embed(request: Request) -> Response:
    body = await _body(request, wire.EmbedRequest)
    inputs = embed_inputs(body.input, truncate=body.truncate)
    vectors, n_tokens, seconds = await _embed_inputs(request, body.model, inputs,
                                                     body.keep_alive)
    return JSONResponse({"model": body.model, "embeddings": vectors,
                         "total_duration": int(seconds * 1e9), "load_duration": 0,
                         "prompt_eval_count": n_tokens},
                        headers=_headers(body))


async def _embeddings(request: Request) -> Response:
    body = await _body(request, wire.EmbeddingsRequest)
    vectors, _, _ = await _embed_inputs(request, body.model,  # cut to fit, as Ollama does
                                        embed_inputs(body.prompt, truncate=True),
                                        body.keep_alive)
    return JSONResponse({"embedding": vectors[0]}, headers=_headers(body))


@router.post("/api/embed", responses=ERROR_RESPONSES)
async def embed(request: Request) -> Response:
    """Ollama embed: ``input`` (a string or a list) → ``embeddings``."""
    return await _answer(request, _embed)


@router.post("/api/embeddings", responses=ERROR_RESPONSES)
async def embeddings(request: Request) -> Response:
    """Ollama's older embeddings endpoint: ``prompt`` → ``embedding``."""
    return await _answer(request, _embeddings)


# -- models -----------------------------------------------------------------------------


async def _tags(request: Request) -> Response:
    ctx = ctx_of(request)
    ctx.auth.tenant(request)
    return JSONResponse({"models": [wire.model_entry(s, _STARTED_UNIX)
                                    for s in ctx.runtime.specs.values()]})


async def _ps(request: Request) -> Response:
    ctx = ctx_of(request)
    ctx.auth.tenant(request)
    out = []
    for m in loaded_models(ctx.runtime):
        spec = ctx.runtime.specs[m.model_id]
        entry = wire.model_entry(spec, _STARTED_UNIX)
        del entry["modified_at"]
        expires = wire.FOREVER_UNIX if m.expires_at_unix is None else m.expires_at_unix
        entry.update(expires_at=wire.created_at(expires), size_vram=0)
        if spec.kind == "generative":
            entry["context_length"] = tokenizer_of(ctx, m.model_id).n_ctx_per_seq
        out.append(entry)
    return JSONResponse({"models": out})


async def _show(request: Request) -> Response:
    body = await _body(request, wire.ModelRequest)
    ctx = ctx_of(request)
    ctx.auth.tenant(request)
    if not body.id:
        raise bad_param("model", "model is required")
    spec = ctx.runtime.specs.get(model_name(ctx, body.id))
    if spec is None:
        raise APIError(404, f"model '{body.id}' not found", param="model",
                       code="model_not_found")
    info: dict[str, Any] = {"general.architecture": spec.backend}
    template = ""
    if spec.kind == "generative":
        tok = tokenizer_of(ctx, spec.model_id)
        info[f"{spec.backend}.context_length"] = tok.n_ctx_per_seq
        template = str(getattr(tok, "chat_template", "") or "")
    return JSONResponse({"modelfile": "", "parameters": "", "template": template,
                         "details": wire.details(spec), "model_info": info,
                         "capabilities": wire.capabilities(spec),
                         "modified_at": wire.created_at(_STARTED_UNIX)})


@router.get("/api/tags")
async def tags(request: Request) -> Response:
    """The configured models (Ollama's local models)."""
    return await _answer(request, _tags)


@router.get("/api/ps")
async def ps(request: Request) -> Response:
    """The loaded models and when each unloads (``expires_at``; a model that never unloads
    by time shows Ollama's far-future time)."""
    return await _answer(request, _ps)


@router.post("/api/show", responses=ERROR_RESPONSES)
async def show(request: Request) -> Response:
    """One model's details, context length, template name and capabilities."""
    return await _answer(request, _show)


@router.get("/api/version")
async def version() -> dict[str, str]:
    """sluice's version."""
    return {"version": sluice.__version__}


_NOT_HERE = ("sluice serves the models its configuration lists: add a [[models]] entry to the "
             "config file, or serve a file with `sluice serve FILE.gguf` (or every GGUF in a "
             "folder with `sluice serve DIR`)")


@router.api_route("/api/{action}", methods=["POST", "DELETE"],
                  include_in_schema=False)
async def not_supported(action: str) -> Response:
    """Model management answers 501 naming the sluice way; other paths are 404."""
    if action in ("pull", "create", "delete", "copy", "push"):
        return ollama_response(APIError(501, f"/api/{action} is not supported: {_NOT_HERE}",
                                     type="not_implemented", code="not_implemented"))
    return ollama_response(APIError(404, f"/api/{action} not found", code="not_found"))
