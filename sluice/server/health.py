"""Liveness and readiness, as plain data.

``liveness`` (``/health``): the runtime's threads do their jobs: the dispatcher and the
worker supervisor run, and no worker is dead without a replacement on the way. A failing
liveness probe is a reason to restart the process.

``readiness`` (``/ready``, the gRPC health service): a request sent now can be served: the
default model is loaded (or loadable again after an eviction), every worker is up (not
being replaced after a death), the runtime is alive, and it is not draining.

One decision for every surface that reports it, so they take the ``AppContext`` and no
web framework objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sluice.server.context import AppContext


@dataclass(frozen=True, slots=True)
class Readiness:
    """Ready or not, and the body that says why."""

    ok: bool
    body: Mapping[str, str]
    """``status``: ``ready``, ``loading``, ``failed``, ``recovering``, ``draining`` or
    ``dead``; ``model``: the default model; ``reason``: what is wrong, when something is."""


def liveness(ctx: AppContext) -> Readiness:
    """Alive: ``{"status": "ok"}``, or ``dead`` with the reason."""
    health = ctx.runtime.health()
    if not health.alive:
        return Readiness(False, {"status": "dead", "reason": health.problem})
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
