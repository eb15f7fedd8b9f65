"""One internal request for every API, and its admission.

An adapter (OpenAI chat or completions, Anthropic Messages, OpenAI Responses, native
``/v1/infer``, gRPC) validates its wire body, builds a ``ServeRequest`` and calls
``open_generation``; what comes back is a ``Generation``: the admitted runtime request and
its event stream (``TokenEvent`` per token, then exactly one ``Final``; ``PromptProgress``
while the prompt is computed, for a request that asked).

``open_generation``'s order is the invariant every surface shares:

1. the model (404 unknown, 400 not generative) and its tokenizer;
2. priority and deadlines (body, then headers or gRPC metadata, then the tenant);
3. the prompt rendered (a chat with the model's template) and bounded by its bytes
   (``prompt_bounds``): one that cannot fit is refused before it is tokenized;
4. the tenant's quota (429, ``Retry-After`` from the bucket), before any tokenizing: it
   reserves the most the request can cost (the prompt's upper bound plus its token limit);
5. the prompt tokenized off the event loop, the token limit checked against the context,
   and the reservation settled to the exact prompt tokens plus the limit;
6. for a request with a decoding constraint, the runtime's queue check
   (``Runtime.refuse_early``: 503 overloaded or draining), then the constraint compiled off
   the event loop (400 naming the field) — an overloaded server never compiles a grammar;
7. runtime admission (``Runtime.open_unit``: variant plan, queue, deadline).

Any refusal raises an ``APIError`` (the adapter renders it in its API's shape); a request
created here and refused, or left by a failure or a cancellation before it was admitted, has
ended ``REJECTED``, so its reservation is given back. An admitted request ends in exactly one
terminal state, whose ``Final`` is the last event of ``Generation.events``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sluice.backends.base import Tokenizer
from sluice.backends.chat import ChatPart, RenderOptions
from sluice.backends.chat import ChatPrompt as BackendChatPrompt
from sluice.config import TenantConfig
from sluice.engine.bridge import AsyncHandle
from sluice.engine.request import Constraint, Final, PromptProgress, RequestStatus, TokenEvent
from sluice.engine.request import Request as RtRequest
from sluice.engine.runtime import Rejected
from sluice.policy.capacity.keep_alive import KeepAlive
from sluice.server import access
from sluice.server.context import AppContext
from sluice.server.core.controls import (
    controls,
    spec_of_kind,
    tokenizer_of,
    ttft_deadline,
    ttft_target,
)
from sluice.server.core.grammar_pool import run_compile
from sluice.server.core.prompt import (
    chat_bounds,
    mixed_bounds,
    text_bounds,
    token_limit,
    tokenize_chat,
    tokenize_mixed,
    tokenize_text,
)
from sluice.server.core.reasoning import ThinkingAsk, ThinkingTags, thinking_plan
from sluice.server.errors import (
    APIError,
    bad_param,
    final_error,
    no_chat_template,
    public_text,
    rejection_error,
)
from sluice.server.params import checked
from sluice.server.quota import TokenBounds


@dataclass(frozen=True)
class TextPrompt:
    """A prompt given as text (BOS added, special tokens in it parsed as the model's)."""

    text: str


@dataclass(frozen=True)
class ChatPrompt:
    """A conversation in OpenAI message shapes (``role``, ``content``, ``tool_calls``,
    ``tool_call_id``, ``reasoning_content``: the past thinking every adapter maps onto its
    turn), rendered with the model's template with ``tools`` offered; user text
    stays plain text."""

    messages: Sequence[Mapping[str, Any]]
    tools: Sequence[Mapping[str, Any]] = ()
    continuation: str | None = None
    """The text of a final assistant turn that continues (``core.prefill``): ``messages``
    end before it, and it follows their rendering (generation prompt included) as plain
    text, unclosed; ``None``: the prompt ends with the generation prompt."""
    add_generation_prompt: bool = True
    """End with the assistant turn's opening (false: the conversation as it stands)."""


@dataclass(frozen=True)
class TokenPrompt:
    """A prompt given as token ids (each checked against the vocabulary)."""

    ids: Sequence[int]


@dataclass(frozen=True)
class MixedPrompt:
    """A prompt given as token ids and texts in order (llama-server's mixed prompt, an
    infill's pieces): each text is tokenized where it stands, after BOS when ``bos``;
    ``special``: special-token text in the texts becomes the model's special tokens."""

    pieces: Sequence[int | str]
    bos: bool = True
    special: bool = True


Prompt = TextPrompt | ChatPrompt | TokenPrompt | MixedPrompt


@dataclass(frozen=True)
class ServeRequest:
    """What a client asked for, whatever API it came through.

    ``sampling`` holds ``SamplingParams`` fields except ``max_tokens`` and ``constraint``
    (the adapter checks them against the model first). ``names`` are the request's own field
    names for the prompt and the token limit, so an error names what the client sent.
    """

    model: str
    prompt: Prompt
    sampling: Mapping[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None
    """The token limit asked for; ``None``: ``default_max_tokens``, capped by the room left."""
    default_max_tokens: int | None = None
    """The limit when none is asked; ``None``: the model's ``default_max_tokens``, else the
    server's."""
    constraint: Constraint | None = None
    """Decoding constrained to a JSON schema, JSON or a grammar (a forced tool call too)."""
    constraint_param: str = "response_format"
    """The field a constraint that does not compile is blamed on."""
    priority: int | None = None
    deadline_ms: float | None = None
    keep_alive: KeepAlive | None = None
    """How long the model stays loaded once idle after this request (Ollama's field);
    ``None``: its configured keep-alive."""
    context_tokens: int | None = None
    """Prompt + generation at most, when smaller than the sequence's context (Ollama's
    ``num_ctx``)."""
    fit_to_context: bool = False
    """A ``max_tokens`` past the room left is cut to it (Ollama's ``num_predict``) rather than
    refused."""
    thinking: ThinkingAsk | None = None
    """What the request asks of a model that thinks in tags (``None``: its defaults)."""
    report_progress: bool = False
    """Its events also hold ``PromptProgress`` while the prompt is computed
    (llama-server's ``return_progress``)."""
    names: tuple[str, str] = ("messages", "max_tokens")


@dataclass
class Generation:
    """An admitted generative request: the runtime request (its ``request_id``,
    ``prompt_tokens`` and decisions) and its handle."""

    request: RtRequest
    handle: AsyncHandle
    tokenizer: Tokenizer
    thinking: ThinkingTags | None = None
    """The tags its output's thinking is split by (``None``: all answer)."""

    def events(self) -> AsyncIterator[TokenEvent | PromptProgress | Final]:
        """Every ``TokenEvent`` as it is produced (with ``PromptProgress`` before them when
        the request asked), then exactly one ``Final`` (last)."""
        return self.handle.events()

    def cancel(self) -> None:
        """End the request ``CANCELLED`` unless it already ended (the client left)."""
        if self.handle.final is None:
            self.handle.cancel()


def final_api_error(final: Final) -> APIError:
    """The error for a request that ended without completing."""
    return final_error(final.error_code, final.error, final.status.name, final.retry_after_s)


async def admit(ctx: AppContext, reqs: list[RtRequest]) -> list[AsyncHandle]:
    """The tenant's quota (429), then runtime admission (503), for the runtime requests of
    one API request, admitted as one unit (``Runtime.open_unit``): all or none, and never
    refused for holding more inputs than the queue. On a refusal every request has ended
    ``REJECTED``, so the quota reservation is given back."""
    access.note_admitted(reqs)
    await ctx.quota.admit(reqs)
    return open_admitted(ctx, reqs)


def open_admitted(ctx: AppContext, reqs: list[RtRequest]) -> list[AsyncHandle]:
    """Runtime admission for requests the quota has already reserved for."""
    try:
        return ctx.runtime.open_unit(reqs)
    except Rejected as exc:
        raise rejection_error(exc.rejection) from None


def _refuse(req: RtRequest, err: APIError, now: float) -> APIError:
    """End ``req`` ``REJECTED`` for a 400 found after its quota was reserved (releasing it)."""
    req.finish(RequestStatus.REJECTED, now, error=err.message, error_code=err.code)
    return err


@dataclass(frozen=True)
class _Rendered:
    """A prompt ready to tokenize (``text``, ``chat`` or ``mixed``), or its ids already
    (``ids``)."""

    text: str | None = None
    chat: BackendChatPrompt | None = None
    ids: list[int] | None = None
    mixed: MixedPrompt | None = None


def rendered_chat(tok: Tokenizer, prompt: ChatPrompt, model: str,
                  param: str = "messages", *,
                  enable_thinking: bool | None = None) -> BackendChatPrompt:
    """The conversation as the model's chat template renders it (every chat surface, and
    llama-server's ``/apply-template``), the template seeing ``enable_thinking`` (``None``:
    the model's default), a continued turn's text after it as plain text: 400
    ``model_has_no_chat_template`` for a completion model, 400 naming ``param`` when the
    template refuses the messages."""
    if tok.chat_template is None:
        raise no_chat_template(model)
    options = RenderOptions(prompt.add_generation_prompt, enable_thinking)
    try:
        rendered = tok.apply_chat(list(prompt.messages), list(prompt.tools) or None, options)
    except ValueError as exc:
        raise bad_param(param, f"Invalid messages: {public_text(str(exc))}") from None
    if prompt.continuation:
        rendered = BackendChatPrompt((*rendered.parts, ChatPart(prompt.continuation, True)))
    return rendered


def _render(ctx: AppContext, tok: Tokenizer, ask: ServeRequest) -> _Rendered:
    """The prompt as the tokenizer will take it: ids checked against the vocabulary, a
    chat rendered with the model's template (400 when it has none or refuses the
    messages)."""
    prompt, param = ask.prompt, ask.names[0]
    if isinstance(prompt, TokenPrompt | MixedPrompt):
        ids = prompt.ids if isinstance(prompt, TokenPrompt) else [
            p for p in prompt.pieces if isinstance(p, int)]
        bad = [t for t in ids if not 0 <= t < tok.vocab_size]
        if bad:
            raise bad_param(param, f"token ids must be in [0, {tok.vocab_size}); got {bad[0]}")
        if isinstance(prompt, MixedPrompt):
            return _Rendered(mixed=prompt)
        return _Rendered(ids=list(prompt.ids))
    if isinstance(prompt, TextPrompt):
        if ctx.config.server.log_content:
            access.note_prompt(prompt.text)
        return _Rendered(text=prompt.text)
    rendered = rendered_chat(tok, prompt, ask.model, param,
                             enable_thinking=ask.thinking.enabled if ask.thinking else None)
    if ctx.config.server.log_content:
        access.note_prompt(rendered.text)
    return _Rendered(chat=rendered)


async def _bounds(tok: Tokenizer, rendered: _Rendered, ask: ServeRequest,
                  default_tokens: int) -> TokenBounds | None:
    """What the request's estimate (prompt + limit per choice) can be before its prompt is
    tokenized; ``None`` for ids (the estimate is exact). Refuses a prompt whose length alone
    cannot fit (``prompt_bounds``)."""
    param = ask.names[0]
    if rendered.ids is not None:
        return None
    if rendered.mixed is not None:
        prompt = await mixed_bounds(tok, rendered.mixed.pieces, param)
    elif rendered.text is not None:
        prompt = await text_bounds(tok, rendered.text, param)
    else:
        prompt = await chat_bounds(tok, _chat(rendered), param)
    context = tok.n_ctx_per_seq if ask.context_tokens is None else min(ask.context_tokens,
                                                                        tok.n_ctx_per_seq)
    asked = ask.max_tokens
    most_limit = min(default_tokens if asked is None else asked, context)
    least_limit = asked if asked is not None and not ask.fit_to_context else 1
    n = int(ask.sampling.get("n", 1))
    return TokenBounds(prompt.least_tokens + least_limit * n,
                       prompt.most_tokens + most_limit * n)


def _chat(rendered: _Rendered) -> BackendChatPrompt:
    assert rendered.chat is not None
    return rendered.chat


async def _tokens(tok: Tokenizer, rendered: _Rendered) -> list[int]:
    if rendered.ids is not None:
        return rendered.ids
    if rendered.text is not None:
        return await tokenize_text(tok, rendered.text)
    if rendered.mixed is not None:
        return await tokenize_mixed(tok, rendered.mixed.pieces, bos=rendered.mixed.bos,
                                    special=rendered.mixed.special)
    return await tokenize_chat(tok, _chat(rendered))


async def open_generation(ctx: AppContext, headers: Mapping[str, str], tenant: TenantConfig,
                          ask: ServeRequest) -> Generation:
    """Admit ``ask`` in the order the module states and return its ``Generation``.
    ``headers``: the HTTP headers or gRPC metadata (``x-sluice-*`` controls)."""
    spec = spec_of_kind(ctx, ask.model, "generative")
    tok = tokenizer_of(ctx, ask.model)
    prio, deadline_s = controls(ctx, headers, tenant, ask.priority, ask.deadline_ms)
    ttft_s = ttft_deadline(ctx, headers, tenant)
    target_s = ttft_target(ctx, headers, tenant)
    default = ask.default_max_tokens
    if default is None:
        default = spec.default_max_tokens or ctx.config.server.default_max_tokens
    if default == -1:  # until the context is full (llama-server's --n-predict -1)
        default = tok.n_ctx_per_seq
    rendered = _render(ctx, tok, ask)
    bounds = await _bounds(tok, rendered, ask, default)
    # Not submitted until its prompt is tokenized: its prompt and limit are set then.
    req = ctx.runtime.new_request(
        ask.model, prompt_tokens=rendered.ids or (),
        params=ctx.runtime.sampling_params(
            ask.model, max_tokens=max(1, default if ask.max_tokens is None else ask.max_tokens),
            constraint=ask.constraint, **ask.sampling),
        tenant_id=tenant.id, priority=prio, deadline_s=deadline_s,
        ttft_deadline_s=ttft_s, ttft_target_s=target_s, keep_alive=ask.keep_alive)
    req.report_progress = ask.report_progress
    access.note_admitted([req])
    reservation = await ctx.quota.admit([req], bounds=bounds)
    try:
        tokens = await _tokens(tok, rendered)
        n_limit = token_limit(tok, len(tokens), ask.max_tokens, default, ask.names,
                              context_tokens=ask.context_tokens, fit=ask.fit_to_context)
        tags, limit = thinking_plan(spec, tok, ask.thinking,
                                    constrained=ask.constraint is not None,
                                    prompt_text=rendered.chat.text if rendered.chat else None)
        req.prompt_tokens = tuple(tokens)
        req.params = replace(req.params, max_tokens=n_limit, thinking=limit)
        await ctx.quota.settle(reservation, [req])
        if ask.constraint is not None:
            early = ctx.runtime.refuse_early([req])
            if early is not None:
                raise rejection_error(early)
            # never on the event loop, and below decoding's CPU priority (grammar_pool)
            await run_compile(checked, ask.constraint, tok, ask.constraint_param,
                              ctx.config.constraints.limits())
        [handle] = open_admitted(ctx, [req])
    except APIError as err:
        raise _refuse(req, err, ctx.runtime.clock()) from None
    except BaseException:
        # a tokenizer failure or the client gone: the reservation must not be held
        req.finish(RequestStatus.REJECTED, ctx.runtime.clock(), error="not admitted",
                   error_code="not_admitted")
        raise
    return Generation(req, handle, tok, tags)


def one_shot_requests(
    ctx: AppContext, headers: Mapping[str, str], model: str, tenant: TenantConfig,
    inputs: list[Any], priority: int | None, deadline_ms: float | None,
    keep_alive: KeepAlive | None = None,
) -> list[RtRequest]:
    """One runtime request per input (so dynamic batching sees each)."""
    prio, deadline_s = controls(ctx, headers, tenant, priority, deadline_ms)
    return [
        ctx.runtime.new_request(model, input=x, tenant_id=tenant.id, priority=prio,
                                deadline_s=deadline_s, keep_alive=keep_alive)
        for x in inputs
    ]
