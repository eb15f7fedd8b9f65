"""Liveness and readiness, as plain data.

``liveness`` (``/health``): the runtime's threads do their jobs: the dispatcher and the
worker supervisor run, and no worker is dead without a replacement on the way; and the
default model did not fail to load at start-up (or has loaded since), as llama-server's
``/health`` fails when its model cannot load. A failing liveness probe is a reason to
restart the process.

``readiness`` (``/ready``, the gRPC health service): a request sent now can be served: the
default model is loaded (or loadable again after an eviction), every worker is up (not
being replaced after a death), the runtime is alive, and it is not draining.

One decision for every surface that reports it, so they take the ``AppContext`` and no
web framework objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sluice.server.context import AppContext


@dataclass(frozen=True, slots=True)
class Readiness:
    """Ready or not, and the body that says why."""

    ok: bool
    body: Mapping[str, Any]
    """``status``: ``ready``, ``loading``, ``failed``, ``recovering``, ``draining`` or
    ``dead``; ``model``: the default model; ``reason``: what is wrong, when something is."""


def liveness(ctx: AppContext) -> Readiness:
    """Alive: ``{"status": "ok"}``, or ``dead`` with the reason, or ``failed`` with the
    default model's load error (and llama-server's ``error`` object)."""
    health = ctx.runtime.health()
    if not health.alive:
        return Readiness(False, {"status": "dead", "reason": health.problem})
    model = ctx.config.default_model
    if ctx.load_error is not None and not any(
            model in w.resident for w in ctx.runtime.snapshot().workers):
        reason = f"model {model} failed to load: {ctx.load_error}"
        return Readiness(False, {"status": "failed", "model": model, "reason": reason,
                                 "error": {"code": 503, "message": reason,
                                           "type": "unavailable_error"}})
    return Readiness(True, {"status": "ok"})


def readiness(ctx: AppContext) -> Readiness:
    """Able to serve the default model now (see the module docstring)."""
    runtime = ctx.runtime
    model = ctx.config.default_model
    if runtime.draining:
        return Readiness(False, {"status": "draining"})
    health = runtime.health()
    if not health.alive:
        return Readiness(False, {"status": "dead", "reason": health.problem})
    if not health.all_up:
        down = [str(i) for i, s in enumerate(health.workers) if s != "up"]
        return Readiness(False, {"status": "recovering", "model": model,
                                 "reason": f"worker {', '.join(down)} is being replaced"})
    snap = runtime.snapshot()
    resident = any(model in w.resident for w in snap.workers)
    if not resident and any(model in w.failed_models for w in snap.workers):
        return Readiness(False, {"status": "failed", "model": model})
    if not (resident or ctx.preloaded):
        return Readiness(False, {"status": "loading", "model": model})
    return Readiness(True, {"status": "ready", "model": model})
