"""Which models are loaded and until when, as the APIs show it (``/v1/models``,
``/api/ps``, ``/status.json``): from the workers' snapshots, on the wall clock."""

from __future__ import annotations

import time
from dataclasses import dataclass

from sluice.engine.runtime import Runtime, RuntimeSnapshot
from sluice.engine.worker import ModelState


@dataclass(frozen=True)
class LoadedModel:
    """A resident model on one worker."""

    model_id: str
    worker_id: int
    memory_bytes: int
    keep_alive: str
    """``pinned``, ``until evicted`` or the idle time (``300s``)."""
    expires_at_unix: float | None
    """When its keep-alive unloads it if no request comes first (while requests run: their
    end plus the idle time); ``None``: never by time (pinned, or until evicted)."""
    in_use: int


def expires_at_unix(model: ModelState, clock_now: float, wall_now: float) -> float | None:
    """``model``'s unload time on the wall clock (``LoadedModel.expires_at_unix``)."""
    if model.expires_at_s is not None:
        return wall_now + max(0.0, model.expires_at_s - clock_now)
    if model.keep_alive_idle_s is not None:  # in use: from now, as the last request ends
        return wall_now + model.keep_alive_idle_s
    return None


def loaded_models(runtime: Runtime) -> list[LoadedModel]:
    """Every resident model, worker by worker, in load order."""
    snap = runtime.snapshot()
    clock_now, wall_now = runtime.clock(), time.time()
    return [LoadedModel(m.model_id, w.worker_id, m.memory_bytes, m.keep_alive,
                        expires_at_unix(m, clock_now, wall_now), m.in_use)
            for w in snap.workers for m in w.models]


def residency_state(snap: RuntimeSnapshot, model_id: str) -> str:
    """``loaded`` (resident on a worker), ``failed`` (not resident, and its last load on
    some worker raised) or ``unloaded``."""
    if any(model_id in w.resident for w in snap.workers):
        return "loaded"
    if any(model_id in w.failed_models for w in snap.workers):
        return "failed"
    return "unloaded"
