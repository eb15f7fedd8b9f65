"""Readiness: whether a request sent now can be served, as plain data.

One decision for every surface that reports it (``/ready`` today, a gRPC health service
later), so it takes the ``AppContext`` and no web framework objects.
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
    """``status``: ``ready``, ``loading``, ``failed`` or ``draining``; ``model``: the
    default model (absent while draining)."""


def readiness(ctx: AppContext) -> Readiness:
    """Able to serve the default model: loaded on a worker (or loadable again after an
    eviction), and not draining."""
    runtime = ctx.runtime
    model = ctx.config.default_model
    if runtime.draining:
        return Readiness(False, {"status": "draining"})
    snap = runtime.snapshot()
    resident = any(model in w.resident for w in snap.workers)
    if not resident and any(model in w.failed_models for w in snap.workers):
        return Readiness(False, {"status": "failed", "model": model})
    if not (resident or ctx.preloaded):
        return Readiness(False, {"status": "loading", "model": model})
    return Readiness(True, {"status": "ready", "model": model})
