"""llama-server's native endpoints on the serving core: ``/completion`` (also at
``/completions``, as llama-server routes it: the OpenAI shape is ``/v1/completions``),
``/infill``, ``/apply-template``, ``/props`` and ``/slots`` (slot files:
``sluice.server.slot_files``); every error in llama-server's shape
(``sluice.server.errors.llama_server_error``). Request fields and their meaning in
sluice: ``sluice.server.llama_wire``; response bodies: ``sluice.server.llama_shapes``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

import sluice
from sluice.backends.base import ModelSpec, Tokenizer
from sluice.backends.chat import chat_tokens
from sluice.backends.packaged import DEFAULT_MODEL_ID, PACKAGED_PREFIX
from sluice.engine.continuous import SlotState
from sluice.server.context import AppContext
from sluice.server.core import (
    ChatPrompt,
    MixedPrompt,
    Prompt,
    ServeRequest,
    model_name,
    open_generation,
    rendered_chat,
    spec_of_kind,
    tokenizer_of,
)
from sluice.server.core.prompt import check_prompt_length
from sluice.server.errors import APIError, bad_param
from sluice.server.lifecycle import residency_state
from sluice.server.llama_shapes import NativeShape, generation_settings
from sluice.server.llama_wire import (
    DEFAULT_SAMPLERS,
    ApplyTemplateRequest,
    InfillRequest,
    NativeCompletionRequest,
    infill_pieces,
    native_sampling,
)
from sluice.server.params import body_constraint
from sluice.server.routes.common import (
    ERROR_RESPONSES,
    Tenant,
    body_headers,
    ctx_of,
    run_generative,
)
from sluice.server.slot_files import SlotActionRequest, slot_file, slot_file_action

log = logging.getLogger("sluice.server")
router = APIRouter(tags=["llama-server"])


async def _complete(request: Request, tenant: Tenant, body: NativeCompletionRequest,
                    prompt: Prompt | None = None) -> Response:
    """Admit ``body`` (with ``prompt`` instead of its own) through the core and answer in
    llama-server's shape."""
    ctx = ctx_of(request)
    headers = body_headers(request, body)
    model = model_name(ctx, body.model)
    spec_of_kind(ctx, model, "generative")
    tok = tokenizer_of(ctx, model)
    if body.max_tokens == 0:
        raise bad_param("n_predict", "n_predict 0 (evaluate the prompt without generating) "
                                     "is not supported: ask for at least 1 token")
    until_full = body.max_tokens == -1  # the core's -1: until the context is full
    constraint, param = body_constraint(body)
    gen = await open_generation(ctx, request.headers, tenant, ServeRequest(
        model, prompt or body.prompt_of(), sampling=native_sampling(body, tok),
        max_tokens=None if until_full else body.max_tokens,
        default_max_tokens=-1 if until_full else None,
        constraint=constraint, constraint_param=param, priority=body.priority,
        deadline_ms=body.deadline_ms, report_progress=body.stream and body.return_progress,
        names=("prompt", "n_predict")))
    shape = NativeShape(gen.request, tok, model, stream=body.stream,
                        return_tokens=body.return_tokens, samplers=body.sampler_names(),
                        timings_per_token=body.timings_per_token)
    return await run_generative(request, gen, shape, stream=body.stream, include_usage=False,
                                headers=headers,
                                keep_events=body.return_tokens or body.n_probs > 0)


@router.post("/completion", responses=ERROR_RESPONSES)
@router.post("/completions", include_in_schema=False)
async def completion(body: NativeCompletionRequest, request: Request,
                     tenant: Tenant) -> Response:
    """llama-server's completion: ``prompt`` (text, token ids or a mix), ``n_predict``,
    sampling, ``n_probs``; ``stream`` gives a ``data:`` chunk per token and a last one with
    ``stop: true``. Several prompts run as a request each and are answered as a list (not
    streamed)."""
    if not body.several():
        return await _complete(request, tenant, body)
    if body.stream:
        raise bad_param("prompt", "several prompts in one request are answered as a list, "
                                  "not streamed: send them as separate streamed requests")
    return await _complete_many(request, tenant, body)


async def _complete_many(request: Request, tenant: Tenant,
                         body: NativeCompletionRequest) -> Response:
    """Each of ``body``'s prompts as a request of its own (admitted one after another, run
    at once); the answers as a list in the prompts' order. A refusal of any prompt is the
    answer, and the others are cancelled."""
    tasks = [asyncio.create_task(_complete(request, tenant, body, p))
             for p in body.prompts_of()]
    try:
        answers = await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    failed = next((a for a in answers if a.status_code != 200), None)
    if failed is not None:  # a client that went away (499)
        return failed
    headers = {k: v for k, v in answers[-1].headers.items()
               if k not in ("content-length", "content-type")}
    return JSONResponse([json.loads(bytes(a.body)) for a in answers], headers=headers)


@router.post("/infill", responses={**ERROR_RESPONSES,
                                   501: {"description": "the model has no FIM tokens"}})
async def infill(body: InfillRequest, request: Request, tenant: Tenant) -> Response:
    """Fill in the middle (``input_prefix``, ``input_suffix``, ``input_extra``,
    ``prompt``) for a model with FIM tokens; 501 for any other."""
    ctx = ctx_of(request)
    model = model_name(ctx, body.model)
    spec_of_kind(ctx, model, "generative")
    fim = tokenizer_of(ctx, model).fim_tokens
    if fim is None:
        raise APIError(501, "Infill is not supported by this model: it has no "
                            "fill-in-the-middle tokens (prefix, suffix and middle)",
                       type="not_supported_error", code="not_supported")
    pieces = infill_pieces(fim, body)
    return await _complete(request, tenant, body, MixedPrompt(pieces, special=False))


@router.post("/apply-template", responses=ERROR_RESPONSES)
async def apply_template(body: ApplyTemplateRequest, request: Request,
                         tenant: Tenant) -> JSONResponse:
    """``messages`` (and ``tools``) rendered with the model's chat template, as a chat
    request's prompt is (``add_generation_prompt`` and ``chat_template_kwargs``'s
    ``enable_thinking`` as the template sees them): ``{"prompt": text}``."""
    headers, model, tok, prompt = await _charged_chat(request, body, tenant, "apply-template")
    rendered = rendered_chat(tok, prompt, model, enable_thinking=body.enable_thinking())
    return JSONResponse({"prompt": rendered.text}, headers=headers)


@router.post("/chat/completions/input_tokens", responses=ERROR_RESPONSES)
@router.post("/v1/chat/completions/input_tokens", include_in_schema=False)
async def chat_input_tokens(body: ApplyTemplateRequest, request: Request,
                            tenant: Tenant) -> JSONResponse:
    """llama-server's token count of a chat request: the prompt tokens its ``messages``
    (and ``tools``) run as, ``{"input_tokens": n}``; one request against the tenant's
    request rate, charged before anything is tokenized."""
    headers, model, tok, prompt = await _charged_chat(request, body, tenant, "input_tokens")
    n = await asyncio.to_thread(_chat_tokens, tok, prompt, model, body.enable_thinking())
    return JSONResponse({"input_tokens": n}, headers=headers)


async def _charged_chat(request: Request, body: ApplyTemplateRequest, tenant: Tenant,
                        call: str) -> tuple[dict[str, str], str, Tokenizer, ChatPrompt]:
    """A chat body's response headers, model, tokenizer and prompt, after one ``call``
    has been charged to the tenant's request rate (nothing is rendered before the charge)."""
    ctx = ctx_of(request)
    headers = body_headers(request, body)
    model = model_name(ctx, body.model)
    spec_of_kind(ctx, model, "generative")
    tok = tokenizer_of(ctx, model)
    await ctx.quota.charge_call(tenant.id, call)
    prompt = ChatPrompt([m.as_dict() for m in body.messages],
                        [t.as_dict() for t in body.tools or []],
                        add_generation_prompt=body.add_generation_prompt)
    return headers, model, tok, prompt


def _chat_tokens(tok: Tokenizer, prompt: ChatPrompt, model: str,
                 enable_thinking: bool | None) -> int:
    rendered = rendered_chat(tok, prompt, model, enable_thinking=enable_thinking)
    check_prompt_length(tok, rendered.text, "messages", whole_context=True)
    return len(chat_tokens(tok, rendered))


def _model_file(spec: ModelSpec) -> str:
    """The model's file name, without its folder (``packaged:<id>`` for a packaged one)."""
    raw = str(spec.options.get("path") or "")
    if spec.backend == "llamacpp" and not raw:
        return PACKAGED_PREFIX + DEFAULT_MODEL_ID
    return raw if raw.startswith(PACKAGED_PREFIX) else Path(raw).name


@router.get("/props", responses={401: {"description": "bad key"},
                                 404: {"description": "unknown model"}})
async def get_props(request: Request, tenant: Tenant, model: str | None = None
                    ) -> JSONResponse:
    """llama-server's server properties for the default model (or ``?model=``): its
    default generation settings, slots, file name, chat template's name; ``is_sleeping``:
    the model is not loaded (unloaded after its keep-alive, llama-server's
    ``--sleep-idle-seconds``; it loads again on the next request that runs it)."""
    ctx = ctx_of(request)
    name = model_name(ctx, model)
    spec = spec_of_kind(ctx, name, "generative")
    tok = tokenizer_of(ctx, name)
    n_predict = spec.default_max_tokens or ctx.config.server.default_max_tokens
    defaults = await asyncio.to_thread(ctx.runtime.sampling_params, name,
                                       max_tokens=max(1, n_predict))
    return JSONResponse({
        "default_generation_settings": {
            "params": generation_settings(defaults, n_predict=n_predict, stream=False,
                                          samplers=DEFAULT_SAMPLERS),
            "n_ctx": tok.n_ctx_per_seq},
        "total_slots": tok.n_seq_max,
        "model_alias": name,
        "model_path": _model_file(spec),
        "modalities": {"vision": False, "video": False, "audio": False},
        "endpoint_slots": ctx.config.server.slots_endpoint,
        "endpoint_props": False,
        "endpoint_metrics": True,
        "chat_template": tok.chat_template or "",
        "chat_template_caps": {},
        "build_info": f"sluice-{sluice.__version__}",
        "is_sleeping": residency_state(ctx.runtime.snapshot(), name) != "loaded",
    })


@router.post("/props", responses={401: {"description": "bad key"},
                                  501: {"description": "not supported"}})
async def post_props(tenant: Tenant) -> Response:
    """Refused, as llama-server refuses it without ``--props``."""
    raise APIError(501, "This server does not support changing global properties: sluice's "
                        "settings come from its configuration file", code="not_supported")


def _slots_enabled(ctx: AppContext) -> None:
    if not ctx.config.server.slots_endpoint:
        raise APIError(501, "This server does not support slots endpoint: it is turned off "
                            "(server.slots_endpoint = false)", code="not_supported")


def _slot_rows(ctx: AppContext, model: str) -> list[tuple[int, SlotState]]:
    """The model's slots on every worker it is resident on, in worker order: a slot's
    position in the list is its ``id``."""
    return [(w.worker_id, slot) for w in ctx.runtime.snapshot().workers for m in w.models
            if m.model_id == model for slot in m.slots]


def _slot_json(index: int, worker_id: int, s: SlotState, n_ctx: int) -> dict[str, Any]:
    busy = s.request_id is not None
    return {"id": index, "id_task": s.request_id if busy else -1, "n_ctx": n_ctx,
            "speculative": False, "is_processing": busy, "n_prompt_tokens": s.n_prompt_tokens,
            "next_token": [{"has_next_token": busy, "has_new_line": False,
                            "n_remain": max(0, s.max_tokens - s.n_decoded) if busy else -1,
                            "n_decoded": s.n_decoded}],
            "worker_id": worker_id}


@router.get("/slots", responses={401: {"description": "bad key"},
                                 404: {"description": "unknown model"},
                                 501: {"description": "turned off"},
                                 503: {"description": "no idle slot (fail_on_no_slot)"}})
async def get_slots(request: Request, tenant: Tenant, model: str | None = None,
                    fail_on_no_slot: str | None = None) -> JSONResponse:
    """The default model's (or ``?model=``'s) sequence slots on every worker it is loaded
    on: whether each runs a request (``id_task``: its request id) and its token counts;
    ``?fail_on_no_slot=1``: 503 when none is idle."""
    ctx = ctx_of(request)
    _slots_enabled(ctx)
    name = model_name(ctx, model)
    spec_of_kind(ctx, name, "generative")
    n_ctx = tokenizer_of(ctx, name).n_ctx_per_seq
    rows = _slot_rows(ctx, name)
    if fail_on_no_slot and all(s.request_id is not None for _, s in rows):
        raise APIError(503, "no slot available", type="unavailable_error",
                       code="no_slot_available", retry_after_s=1.0)
    return JSONResponse([_slot_json(i, w, s, n_ctx) for i, (w, s) in enumerate(rows)])


@router.post("/slots/{id_slot}", responses={**ERROR_RESPONSES,
                                           501: {"description": "turned off; save and restore "
                                                                "without a slot folder"}})
async def slot_action(id_slot: int, request: Request, tenant: Tenant, action: str = "",
                      model: str | None = None,
                      body: SlotActionRequest | None = None) -> JSONResponse:
    """``?action=erase``: forget the prompt KV an idle slot retained (503 while a request
    uses it). ``save`` and ``restore`` (with ``server.slot_save_path``, else 501): the slot's
    KV to or from ``filename`` in that folder (``sluice.server.slot_files``); they load the
    model first, as a request would."""
    ctx = ctx_of(request)
    _slots_enabled(ctx)
    if action not in ("erase", "save", "restore"):
        raise bad_param("action", "Invalid action: give action=erase, save or restore")
    body = body or SlotActionRequest()
    headers = body_headers(request, body)
    path = None if action == "erase" else slot_file(ctx, action, body.filename)
    name = model_name(ctx, body.model or model)
    spec_of_kind(ctx, name, "generative")
    rows = _slot_rows(ctx, name)
    if not rows and path is not None:
        await _load(ctx, name)
        rows = _slot_rows(ctx, name)
    if not 0 <= id_slot < len(rows):
        raise bad_param("id_slot", f"Invalid slot ID {id_slot}: the model has {len(rows)} "
                                   f"slots loaded (GET /slots lists them)")
    worker_id, state = rows[id_slot]
    if path is not None:
        await ctx.quota.charge_call(tenant.id, f"slots-{action}")
        out = await slot_file_action(ctx, action, name, worker_id, state.slot, path,
                                     tenant.id, id_slot)
        return JSONResponse(out, headers=headers)
    try:
        erased = await asyncio.to_thread(ctx.runtime.erase_slot, name, worker_id, state.slot)
    except (ValueError, RuntimeError):  # unloaded, or its worker replaced, since the look
        raise APIError(503, f"Slot {id_slot} is not loaded now: GET /slots lists the slots",
                       code="slot_unavailable", retry_after_s=1.0) from None
    if erased is None:
        raise APIError(503, f"Slot {id_slot} is processing a request: erase it once it is "
                            f"idle", code="slot_busy", retry_after_s=1.0)
    return JSONResponse({"id_slot": id_slot, "n_erased": erased}, headers=headers)


async def _load(ctx: AppContext, model: str) -> None:
    """Make ``model`` resident (a save or restore of a model not loaded yet)."""
    try:
        await asyncio.to_thread(ctx.runtime.call_on_workers, model, "load")
    except Exception as exc:
        log.error("model %s: load for a slot action failed: %s", model, exc)
        raise APIError(503, "The model could not be loaded.", type="server_error",
                       code="model_load_failed", retry_after_s=1.0) from None
