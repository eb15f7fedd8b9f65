"""Tokenizer endpoints in llama-server's and vLLM's shapes, and ``/version``.

``POST /tokenize`` answers llama-server's request (``content``, ``add_special``,
``parse_special``, ``with_pieces`` → ``{"tokens": [...]}``) or vLLM's (``prompt`` or chat
``messages``, ``add_special_tokens``, ``return_token_strs`` → ``{"count", "max_model_len",
"tokens", "token_strs"}``); ``POST /detokenize`` takes ``tokens`` and answers both shapes at
once (``content`` for llama-server, ``prompt`` for vLLM). ``model`` defaults to the server's
default model.
"""

from __future__ import annotations

import asyncio
from importlib import metadata
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from sluice.backends.base import Tokenizer
from sluice.backends.chat import RenderOptions, chat_tokens
from sluice.server.core import check_prompt_length, spec_of_kind, tokenizer_of
from sluice.server.errors import APIError, bad_param, no_chat_template, public_text
from sluice.server.routes.common import ERROR_RESPONSES, Tenant, body_headers, ctx_of
from sluice.server.schemas.native import DetokenizeRequest, TokenizeRequest

router = APIRouter(tags=["tokens"])


def _tokenizer(request: Request, model: str | None) -> Tokenizer:
    ctx = ctx_of(request)
    name = model or ctx.config.default_model
    spec_of_kind(ctx, name, "generative")
    return tokenizer_of(ctx, name)


def _piece(raw: bytes) -> str | list[int]:
    """llama-server's ``piece``: the text, or its bytes when they are not valid UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


def _tokenize(tok: Tokenizer, body: TokenizeRequest) -> list[int]:
    """In a worker thread; a text that cannot fit even the model's whole context is refused
    by its length before it is tokenized."""
    if body.messages is not None:
        tools = [t.as_dict() for t in body.tools or []]
        prompt = tok.apply_chat([m.as_dict() for m in body.messages], tools or None,
                                RenderOptions(body.add_generation_prompt))
        check_prompt_length(tok, prompt.text, "messages", whole_context=True)
        ids = chat_tokens(tok, prompt)  # BOS first, as a chat request runs it
        return ids if body.add_special_tokens else ids[len(tok.tokenize("", add_bos=True)):]
    if body.content is not None:
        check_prompt_length(tok, body.content, "content", whole_context=True)
        return tok.tokenize(body.content, add_bos=bool(body.add_special),
                            special=body.parse_special)
    assert body.prompt is not None
    check_prompt_length(tok, body.prompt, "prompt", whole_context=True)
    add = True if body.add_special_tokens is None else body.add_special_tokens
    return tok.tokenize(body.prompt, add_bos=add, special=body.parse_special)


@router.post("/tokenize", responses=ERROR_RESPONSES)
async def tokenize(body: TokenizeRequest, request: Request, tenant: Tenant) -> JSONResponse:
    """Token ids of a text (or of a chat conversation as the chat endpoint renders it)."""
    headers = body_headers(request, body)
    tok = _tokenizer(request, body.model)
    await ctx_of(request).quota.charge_call(tenant.id, "tokenize")
    if body.messages is not None and tok.chat_template is None:
        raise no_chat_template(body.model or ctx_of(request).config.default_model)
    try:
        ids = await asyncio.to_thread(_tokenize, tok, body)
    except ValueError as exc:
        raise bad_param("messages", f"Invalid messages: {public_text(str(exc))}") from None
    if body.content is not None:  # llama-server's shape
        tokens: list[Any] = ([{"id": t, "piece": _piece(tok.token_bytes(t))} for t in ids]
                             if body.with_pieces else ids)
        return JSONResponse({"tokens": tokens}, headers=headers)
    strs = ([tok.token_bytes(t).decode("utf-8", "replace") for t in ids]
            if body.return_token_strs else None)
    return JSONResponse({"count": len(ids), "max_model_len": tok.n_ctx_per_seq,
                         "tokens": ids, "token_strs": strs}, headers=headers)


@router.post("/detokenize", responses=ERROR_RESPONSES)
async def detokenize(body: DetokenizeRequest, request: Request,
                     tenant: Tenant) -> JSONResponse:
    """The text of token ids (special tokens such as BOS contribute nothing)."""
    headers = body_headers(request, body)
    tok = _tokenizer(request, body.model)
    room = tok.n_ctx_per_seq * tok.n_seq_max
    if len(body.tokens) > room:
        raise APIError(400, f"This model's context holds {room} tokens in all; got "
                            f"{len(body.tokens)} token ids.", param="tokens",
                       code="context_length_exceeded")
    await ctx_of(request).quota.charge_call(tenant.id, "detokenize")
    bad = [t for t in body.tokens if not 0 <= t < tok.vocab_size]
    if bad:
        raise bad_param("tokens", f"token ids must be in [0, {tok.vocab_size}); got {bad[0]}")
    text = await asyncio.to_thread(_detokenize, tok, body.tokens)
    return JSONResponse({"content": text, "prompt": text}, headers=headers)


def _detokenize(tok: Tokenizer, tokens: list[int]) -> str:
    """In a worker thread (a context's worth of ids is milliseconds of C calls)."""
    return b"".join(tok.token_bytes(t) for t in tokens).decode("utf-8", "replace")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


@router.get("/version")
async def version() -> dict[str, Any]:
    """sluice's version (vLLM's shape), and the runtimes it was installed with."""
    return {"version": _version("sluice") or "0.0.0",
            "llama_cpp_python": _version("llama-cpp-python"),
            "onnxruntime": _version("onnxruntime")}
