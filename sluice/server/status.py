"""``/status.json``: what the status page (``static/status.html``, polling it every second)
draws. Queue, workers and their resident models from the runtime snapshot; the last
minutes from the metrics history (``sluice.server.history``); each configured model's
residency, KV use and time until its keep-alive unloads it; each tenant's usage against its
quota (the quota gate's bookkeeping, as ``/metrics`` shows it); the last decisions
(``sluice.server.decisions``). Exception text (a model's load error, a worker's cause of
death) has its file paths redacted, as in error bodies (the detail is in the log)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from sluice.engine.runtime import Runtime, RuntimeSnapshot
from sluice.engine.worker import spec_keep_alive
from sluice.server.context import AppContext
from sluice.server.decisions import Decision
from sluice.server.errors import public_text
from sluice.server.history import History, Point, TenantRate
from sluice.server.lifecycle import residency_state
from sluice.server.quota import QuotaGate

DIGITS = 4
"""Decimal places of the history's numbers (enough for a chart, small on the wire)."""


def status_json(ctx: AppContext) -> dict[str, Any]:
    """Everything the status page shows, as plain JSON."""
    runtime = ctx.runtime
    snap = runtime.snapshot()
    now = runtime.clock()
    return {
        "queue_depth": snap.queue_depth,
        "queue_capacity": snap.queue_capacity,
        "live_requests": snap.live_requests,
        "draining": snap.draining,
        "completions_per_s": round(snap.completions_per_s, 3),
        "scheduler": runtime.config.queue.scheduler,
        "router": runtime.config.queue.router,
        "default_model": ctx.config.default_model,
        "workers": worker_entries(snap, now),
        "models": model_entries(runtime, snap, now),
        "tenants": tenant_entries(ctx, ctx.history.tenant_rates()),
        "history": history_entry(ctx.history, now),
        "decisions": [decision_entry(d, now) for d in ctx.decisions.latest()],
        "variants": runtime.variants.snapshot(),
        "groups": runtime.variants.groups_snapshot(),
        "recoveries": [{**asdict(r), "cause": public_text(r.cause)}
                       for r in runtime.recoveries()],
    }


def worker_entries(snap: RuntimeSnapshot, now: float) -> list[dict[str, Any]]:
    """Per worker: status, inbox, running requests, memory, last batch, resident models."""
    workers = []
    statuses = snap.worker_status or ("up",) * len(snap.workers)
    for state, depth, status in zip(snap.workers, snap.inbox_depths, statuses, strict=True):
        workers.append({
            "worker_id": state.worker_id,
            "status": status,
            "inbox_depth": depth,
            "active": state.active_count,
            "budget_bytes": state.budget_bytes,
            "resident_bytes": state.resident_bytes,
            "last_batch_size": state.last_batch_size,
            "models": [model_entry(asdict(m), now) for m in state.models],
            "failed_models": {m: public_text(e) for m, e in state.failed_models.items()},
        })
    return workers


def model_entry(model: dict[str, Any], now: float) -> dict[str, Any]:
    """A resident model's status entry, with ``expires_in_s``: seconds until its keep-alive
    unloads it if no request comes first (``None``: in use, pinned or kept until evicted)."""
    expires = model.get("expires_at_s")
    model["expires_in_s"] = None if expires is None else round(max(0.0, expires - now), 3)
    return model


def model_entries(runtime: Runtime, snap: RuntimeSnapshot, now: float) -> list[dict[str, Any]]:
    """Per configured model, over every worker: ``state`` (as ``/v1/models``), the workers
    holding it, their memory (the configured estimate while unloaded), requests in use, KV
    blocks used and in all, its keep-alive and ``unloads_in_s`` (the soonest of its copies
    to unload by time if no request comes; ``None``: in use, pinned, kept until evicted, or
    not loaded)."""
    out = []
    for spec in runtime.specs.values():
        copies = [(w.worker_id, m) for w in snap.workers for m in w.models
                  if m.model_id == spec.model_id]
        kv_total = sum(m.kv_total_blocks or 0 for _, m in copies)
        kv_free = sum(m.kv_free_blocks or 0 for _, m in copies)
        expiries = [m.expires_at_s - now for _, m in copies if m.expires_at_s is not None]
        failures = [w.failed_models[spec.model_id] for w in snap.workers
                    if spec.model_id in w.failed_models]
        out.append({
            "id": spec.model_id,
            "kind": spec.kind,
            "state": residency_state(snap, spec.model_id),
            "workers": [worker_id for worker_id, _ in copies],
            "memory_bytes": (sum(m.memory_bytes for _, m in copies) if copies
                             else spec.memory_bytes),
            "in_use": sum(m.in_use for _, m in copies),
            "kv_used_blocks": kv_total - kv_free if kv_total else None,
            "kv_total_blocks": kv_total or None,
            "keep_alive": copies[0][1].keep_alive if copies
            else spec_keep_alive(spec).describe(),
            "unloads_in_s": round(max(0.0, min(expiries)), 3) if expiries else None,
            "error": public_text(failures[0]) if failures and not copies else None,
        })
    return out


def tenant_entries(ctx: AppContext, rates: Mapping[str, TenantRate]) -> list[dict[str, Any]]:
    """Per configured tenant (and per other tenant label with traffic in the window:
    ``default``, ``other``): admitted requests and counted tokens per second over the
    history's window, its limits (``None``: unlimited), and the quota gate's state: requests
    in flight, what its buckets held at its last check, refusals by limit."""
    gate: QuotaGate = ctx.quota
    ids = [t.id for t in ctx.config.tenants]
    ids += [label for label in rates if label not in ids]
    out = []
    for tenant_id in ids:
        rate = rates.get(tenant_id, TenantRate(0.0, 0.0))
        limits = gate.limits(tenant_id)
        out.append({
            "id": tenant_id,
            "requests_per_s": round(rate.requests_per_s, DIGITS),
            "tokens_per_s": round(rate.tokens_per_s, DIGITS),
            "limits": None if limits is None else {
                "requests_per_s": limits.requests_per_s,
                "request_burst": limits.request_burst if limits.requests_per_s else None,
                "tokens_per_s": limits.tokens_per_s,
                "token_capacity": limits.token_capacity if limits.tokens_per_s else None,
                "max_concurrent": limits.max_concurrent,
            },
            "in_flight": gate.in_flight.get(tenant_id, 0),
            "remaining": {limit: round(value, 3) for (tenant, limit), value
                          in gate.remaining.items() if tenant == tenant_id},
            "refusals": {limit: n for (tenant, limit), n in gate.rejections.items()
                         if tenant == tenant_id},
        })
    return out


def history_entry(history: History, now: float) -> dict[str, Any]:
    """The chart points, oldest first, each with ``age_s`` (seconds before ``now``)."""
    return {
        "interval_s": history.interval_s,
        "span_s": history.capacity * history.interval_s,
        "window_s": history.window_s,
        "points": [point_entry(p, now) for p in history.points()],
    }


def point_entry(point: Point, now: float) -> dict[str, Any]:
    """One chart point as JSON."""

    def num(value: float | None) -> float | None:
        return None if value is None else round(value, DIGITS)

    return {
        "age_s": round(now - point.at_s, 3),
        "tokens_per_s": num(point.tokens_per_s),
        "waiting": point.waiting,
        "running": point.running,
        "ttft_p95_s": num(point.ttft_p95_s),
        "tpot_p95_s": num(point.tpot_p95_s),
        "refusals_per_s": {k: num(v) for k, v in sorted(point.refusals_per_s.items())},
    }


def decision_entry(d: Decision, now: float) -> dict[str, Any]:
    """One decision as JSON, with ``age_s`` (seconds since it ended)."""
    out = asdict(d)
    del out["at_s"]
    for key in ("predicted_wait_s", "queue_wait_s", "ttft_s"):
        if out[key] is not None:
            out[key] = round(out[key], DIGITS)
    return {"age_s": round(max(0.0, now - d.at_s), 3), **out}
