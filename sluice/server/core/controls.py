"""A request's controls from its transport: priority, deadline and first-token deadline
(body field or gRPC deadline, then ``x-sluice-*`` headers or gRPC metadata, then the
tenant's defaults), the model it names, and the decision headers the runtime's choices give
back."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from sluice.backends.base import ModelSpec, Tokenizer
from sluice.config import RERANK_SUFFIX, TenantConfig
from sluice.engine.request import Request as RtRequest
from sluice.engine.worker import spec_keep_alive
from sluice.server.context import AppContext
from sluice.server.errors import APIError, bad_param, unknown_model
from sluice.server.lifecycle import loaded_models, residency_state

log = logging.getLogger("sluice.server")


OLLAMA_DEFAULT_TAG = ":latest"
"""The tag Ollama's clients add to a name without one: ``name`` and ``name:latest`` are one
model there, and so here."""


def _spellings(asked: str) -> tuple[str, ...]:
    """``asked``, then the same name with Ollama's default tag taken off or put on."""
    if asked.endswith(OLLAMA_DEFAULT_TAG) and len(asked) > len(OLLAMA_DEFAULT_TAG):
        return asked, asked[: -len(OLLAMA_DEFAULT_TAG)]
    if ":" not in asked.rpartition("/")[2]:
        return asked, asked + OLLAMA_DEFAULT_TAG
    return (asked,)


def model_name(ctx: AppContext, asked: str | None) -> str:
    """The model a request is served by, on every API: the default model when it names none
    (``server.default_model``), a configured model or one of its ``model_aliases`` (``name``
    and Ollama's ``name:latest`` being one name); an unknown name is returned as it is (the
    caller's lookup answers 404), or with ``server.unknown_model = "default"`` on a server
    of one configured model, the default model (a model's own embedding model, which
    ``--embedding`` adds beside it, does not make it a two-model server)."""
    server = ctx.config.server
    if not asked:
        return ctx.config.default_model
    for name in _spellings(asked):
        if ctx.runtime.spec_for(name) is not None:
            return name
        if name in server.model_aliases:
            return server.model_aliases[name]
    if server.unknown_model == "default" and len(ctx.config.models) == 1:
        return ctx.config.default_model
    return asked


def spec_of_kind(ctx: AppContext, model: str, kind: str) -> ModelSpec:
    """The model's spec: 404 when unknown, 400 ``model_kind_mismatch`` when not ``kind``."""
    spec = ctx.runtime.spec_for(model)
    if spec is None:
        raise unknown_model(model)
    if spec.kind != kind:
        want = "a generative" if kind == "generative" else "an embedding/one-shot"
        raise bad_param("model", f"The model '{model}' is not {want} model",
                        code="model_kind_mismatch")
    return spec


def embedding_spec(ctx: AppContext, model: str) -> ModelSpec:
    """The spec of the model that embeds for ``model``: an embedding model, or the one-shot
    model of a generative model started with embeddings on (``[models.embeddings]``,
    ``--embedding``). 404 unknown; 400 ``model_kind_mismatch`` for any other model."""
    spec = ctx.runtime.spec_for(model)
    if spec is not None and spec.kind == "generative":
        if spec.embedding_model is None:
            raise bad_param("model", f"The model '{model}' does not embed: start it with "
                                     f"embeddings on (--embedding, or [models.embeddings])",
                            code="model_kind_mismatch")
        return ctx.runtime.specs[spec.embedding_model]
    spec = spec_of_kind(ctx, model, "oneshot")
    if spec.task != "embedding":
        raise bad_param("model", f"The model '{model}' is not an embedding model",
                        code="model_kind_mismatch")
    return spec


RERANK_HOWTO = ('configure a one-shot model with task = "rerank" (docs/models.md, "Rerankers"), '
                'such as the packaged encoder: backend = "onnx", options.path = '
                '"packaged:all-minilm-l6-v2"; or start a reranker GGUF with --reranking')


def rerank_model(ctx: AppContext, asked: str | None) -> str:
    """The model a rerank request is served by: the one it names (``model_name``: 404
    unknown; a generative model's ``MODEL:rerank`` when it has one; 400
    ``model_kind_mismatch`` when it does not rerank); naming none, the default
    model if it reranks, else the first configured reranker, else 501
    ``rerank_not_supported`` (llama-server without ``--reranking``)."""
    if asked:
        model = model_name(ctx, asked)
        spec = ctx.runtime.spec_for(model)
        if spec is None:
            raise unknown_model(model)
        if spec.task == "rerank":
            return model
        companion = ctx.runtime.spec_for(f"{model}{RERANK_SUFFIX}")
        if companion is not None and companion.task == "rerank":
            return companion.model_id  # a GGUF started with --reranking
        raise bad_param("model", f"The model '{model}' does not rerank: {RERANK_HOWTO}",
                        code="model_kind_mismatch")
    names = [ctx.config.default_model, *ctx.runtime.specs, *ctx.runtime.variants.groups]
    for name in names:
        spec = ctx.runtime.spec_for(name)
        if spec is not None and spec.task == "rerank":
            return name
    raise APIError(501, f"This server does not serve reranking: {RERANK_HOWTO}",
                   type="not_supported_error", code="rerank_not_supported")


def check_text_input(spec: ModelSpec, model: str) -> None:
    """400 ``model_kind_mismatch`` for a reranker asked for one text's output (``/v1/infer``,
    gRPC ``Infer``): it scores a query's documents, through ``/v1/rerank``."""
    if spec.task == "rerank":
        raise bad_param("model", f"The model '{model}' is a reranker: it scores documents "
                                 f"against a query (POST /v1/rerank), not one input",
                        code="model_kind_mismatch")


def tokenizer_of(ctx: AppContext, model: str) -> Tokenizer:
    """The model's tokenizer; a model file that cannot even be read (missing, corrupt,
    truncated) is the model failing to load: 503 ``model_load_failed``."""
    try:
        return ctx.runtime.tokenizer(model)
    except Exception as exc:
        log.error("model %s: tokenizer failed to load: %s", model, exc)
        raise APIError(503, "The model could not be loaded.", type="server_error",
                       code="model_load_failed", retry_after_s=1.0) from None


def generative_entry(ctx: AppContext, model: str) -> dict[str, Any]:
    """What a generative model's listing adds: ``capabilities`` (``["completion",
    "chat"]``, or ``["completion"]`` for a completion model, one without a chat template),
    ``chat_template`` (its name), and the sampling defaults in force for the fields a
    request leaves out, with where each came from (``model``: the file, ``config``,
    ``llama-server``). Loads the model's tokenizer; empty if it cannot be read."""
    try:
        tok = ctx.runtime.tokenizer(model)
        defaults = ctx.runtime.sampling_defaults(model)
    except Exception:  # the listing says "failed" once a load has; never a 500 here
        return {}
    chat = tok.chat_template is not None
    return {"capabilities": ["completion", "chat"] if chat else ["completion"],
            "chat_template": tok.chat_template,
            "sampling_defaults": dict(defaults.values),
            "sampling_defaults_from": dict(defaults.sources)}


def _header_number(headers: Mapping[str, str], name: str, lo: float,
                   hi: float) -> float | None:
    raw = headers.get(name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise bad_param(name, f"Header {name} must be a number") from None
    if not lo < value <= hi:
        raise bad_param(name, f"Header {name} must be in ({lo}, {hi}]")
    return value


def controls(
    ctx: AppContext, headers: Mapping[str, str], tenant: TenantConfig, priority: int | None,
    deadline_ms: float | None,
) -> tuple[int, float | None]:
    """Priority and absolute deadline: body (or the gRPC deadline), then headers (or gRPC
    metadata), then the tenant's defaults. A request may lower its priority but never raise
    it above the tenant's ceiling (``priority_ceiling``): asking for more gets the ceiling."""
    if priority is None:
        header = _header_number(headers, "x-sluice-priority", -1, 9)
        if header is not None and not header.is_integer():
            raise bad_param("x-sluice-priority", "Header x-sluice-priority must be an integer")
        priority = int(header) if header is not None else tenant.priority
    priority = max(priority, tenant.most_urgent_priority)
    if deadline_ms is None:
        deadline_ms = _header_number(headers, "x-sluice-deadline-ms", 0, 86_400_000)
    if deadline_ms is None:
        deadline_ms = tenant.default_deadline_ms
    deadline_s = None if deadline_ms is None else ctx.runtime.clock() + deadline_ms / 1000.0
    return priority, deadline_s


def ttft_deadline(ctx: AppContext, headers: Mapping[str, str],
                  tenant: TenantConfig) -> float | None:
    """A generative request's absolute first-token deadline: the ``x-sluice-ttft-deadline-ms``
    header (or gRPC metadata), then the tenant's default; ``None`` leaves the model's
    default (``ttft_deadline_ms``) to the runtime."""
    ms = _header_number(headers, "x-sluice-ttft-deadline-ms", 0, 86_400_000)
    if ms is None:
        ms = tenant.default_ttft_deadline_ms
    return None if ms is None else ctx.runtime.clock() + ms / 1000.0


def ttft_target(ctx: AppContext, headers: Mapping[str, str],
                tenant: TenantConfig) -> float | None:
    """A generative request's absolute first-token target (soft): the
    ``x-sluice-ttft-target-ms`` header (or gRPC metadata), then the tenant's default;
    ``None`` leaves the model's default (``ttft_target_ms``) to the runtime."""
    ms = _header_number(headers, "x-sluice-ttft-target-ms", 0, 86_400_000)
    if ms is None:
        ms = tenant.default_ttft_target_ms
    return None if ms is None else ctx.runtime.clock() + ms / 1000.0


def decision_headers(req: RtRequest) -> dict[str, str]:
    """The ``x-sluice-*`` headers that say how the runtime decided (id, tenant, priority
    served at, worker, queue wait, route, variant, predicted wait), and what to check a
    planned request's prediction against (``plan_headers``)."""
    headers = {"x-sluice-request-id": str(req.request_id), "x-sluice-tenant": req.tenant_id,
               "x-sluice-priority": str(req.priority)}
    if req.worker_id is not None:
        headers["x-sluice-worker"] = str(req.worker_id)
    t = req.times
    if t.started_s is not None and t.queued_s is not None:
        headers["x-sluice-queue-wait-ms"] = f"{(t.started_s - t.queued_s) * 1000:.1f}"
    if req.route_reason:
        headers["x-sluice-route"] = req.route_reason.replace("\n", " ")[:200]
    if req.variant:
        headers["x-sluice-variant"] = req.variant
    if req.predicted_wait_s is not None:
        headers["x-sluice-predicted-wait-ms"] = f"{req.predicted_wait_s * 1000:.1f}"
    return headers | plan_headers(req)


def plan_headers(req: RtRequest) -> dict[str, str]:
    """HTTP only (diagnostics, not in gRPC's ``Decision``): for a one-shot request, the
    batch it ran in and its run time; for one that named a model group, the planner's
    reason, predicted sojourn (from its arrival) and predicted run time of the batch it
    was placed in, beside the server's own sojourn, and
    whether the pool was idle and the most accurate variant would have met the deadline
    alone (``VariantChoice``). ``plan-reason`` is ``replanned`` when it ran elsewhere."""
    headers: dict[str, str] = {}
    t = req.times
    if req.batch_size is not None:
        headers["x-sluice-batch-size"] = str(req.batch_size)
        if t.started_s is not None and t.finished_s is not None:
            headers["x-sluice-run-ms"] = f"{(t.finished_s - t.started_s) * 1000:.1f}"
    plan = req.plan
    if plan is None:
        return headers
    moved = plan.variant is not None and req.variant != plan.variant
    headers["x-sluice-plan-reason"] = "replanned" if moved else plan.reason
    if math.isfinite(plan.predicted_sojourn_s):
        headers["x-sluice-predicted-sojourn-ms"] = f"{plan.predicted_sojourn_s * 1000:.1f}"
    chosen = next((p for p in plan.predictions if p.variant == plan.variant), None)
    if chosen is not None:  # its batch's time, before the pessimism factor
        headers["x-sluice-predicted-run-ms"] = f"{chosen.service_s * 1000:.1f}"
    if t.finished_s is not None:
        headers["x-sluice-sojourn-ms"] = f"{(t.finished_s - req.arrival_s) * 1000:.1f}"
    if plan.pool_idle is not None:
        headers["x-sluice-pool-idle"] = str(int(plan.pool_idle))
    if plan.accurate_fits_alone is not None:
        headers["x-sluice-accurate-fits-alone"] = str(int(plan.accurate_fits_alone))
    # the low-load test's inputs: the group's arrival rate, its standard error, the line
    headers["x-sluice-plan-arrival"] = (f"{plan.arrival_per_s:.3f} {plan.arrival_stderr_per_s:.3f} "
                                        f"{plan.low_load_line_per_s:.3f}")
    return headers


def model_list(ctx: AppContext) -> list[dict[str, Any]]:
    """Configured models and groups, with where each model is resident (``/v1/models``,
    gRPC ``ListModels``), its ``state`` (``loaded``, ``unloaded`` or ``failed``), its
    ``keep_alive`` and ``expires_at`` (Unix seconds its keep-alive unloads it at if no
    request comes first; ``None``: not by time, or not loaded), its ``aliases`` (every name
    that serves it, its id among them, as llama-server lists its ``--alias`` names) and
    ``tags`` (``models.tags``, llama-server's ``--tags``) and, for generative models,
    ``generative_entry``. Call it off the event loop: the first listing of a model reads its
    vocabulary."""
    snap = ctx.runtime.snapshot()
    loaded = {m.model_id: m for m in loaded_models(ctx.runtime)}
    tags = {m.id: m.tags for m in ctx.config.models}
    names: dict[str, list[str]] = {}
    for alias, target in ctx.config.server.model_aliases.items():
        names.setdefault(target, []).append(alias)
    data: list[dict[str, Any]] = []
    for spec in ctx.runtime.specs.values():
        resident_on = [w.worker_id for w in snap.workers if spec.model_id in w.resident]
        failed = [w.failed_models[spec.model_id] for w in snap.workers
                  if spec.model_id in w.failed_models]
        here = loaded.get(spec.model_id)
        data.append({
            "id": spec.model_id,
            "object": "model",
            "created": 0,
            "owned_by": "sluice",
            "kind": spec.kind,
            "task": spec.task,
            "resident": bool(resident_on),
            "resident_on": resident_on,
            "status": "failed" if failed and not resident_on else "available",
            "state": residency_state(snap, spec.model_id),
            "keep_alive": here.keep_alive if here else spec_keep_alive(spec).describe(),
            "expires_at": None if here is None or here.expires_at_unix is None
            else round(here.expires_at_unix, 3),
            "aliases": sorted([spec.model_id, *names.get(spec.model_id, [])]),
            "tags": list(tags.get(spec.model_id, [])),
            **(generative_entry(ctx, spec.model_id) if spec.kind == "generative" else {}),
        })
    for group_id, group in ctx.runtime.variants.groups.items():
        data.append({"id": group_id, "object": "model", "created": 0, "owned_by": "sluice",
                     "kind": "group", "task": ctx.runtime.variants.lead_spec(group_id).task,
                     "variants": list(group.variants), "policy": group.planner.policy})
    return data
