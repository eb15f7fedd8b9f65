"""Fault injection for the tests and the chaos bench: make a loaded model kill its worker's
thread or hang inside ``forward`` / ``run_batch``, on chosen calls or at random.

A ``FaultPlan`` is configuration (``[models.faults]``, never set in production). A
``FaultInjector`` is its live state: one per model id for the life of the runtime, shared
by every load of that model, so call numbers count across a dead worker and its
replacement (``kill_on_calls = [3]`` kills one worker once; the replacement serves) and the
random draws go on from one seeded stream. ``arm`` wraps a loaded model's call in place;
the backend knows nothing about it, so the same plan works on every backend.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sluice.backends.base import GenerativeModel, OneShotModel


class WorkerKilled(BaseException):
    """An injected fault that ends the worker's execution thread. A ``BaseException``, so
    it passes every ``except Exception`` (the crash barriers) as a bug outside them would."""


@dataclass(frozen=True)
class FaultPlan:
    """Which calls of a model fail, and how. Calls are numbered from 1 across every load
    of the model in this process."""

    kill_on_calls: frozenset[int] = frozenset()
    """These calls raise ``WorkerKilled`` (the worker's thread dies)."""
    hang_on_calls: frozenset[int] = frozenset()
    """These calls sleep ``hang_s`` before running (the worker stalls)."""
    kill_probability: float = 0.0
    """Each call raises ``WorkerKilled`` with this probability."""
    hang_probability: float = 0.0
    """Each call hangs with this probability."""
    hang_s: float = 3600.0
    """How long a hang lasts (then the call runs; a replaced worker's thread then ends)."""
    seed: int = 0
    """Seeds the random draws."""

    def __post_init__(self) -> None:
        for name in ("kill_probability", "hang_probability"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"faults.{name} must lie in [0, 1], got {p}")
        if not self.hang_s >= 0:
            raise ValueError(f"faults.hang_s must be >= 0, got {self.hang_s}")


class FaultInjector:
    """The live state of one model's ``FaultPlan``: a call counter and a random stream.
    Thread-safe (a hung worker and its replacement may both call)."""

    def __init__(self, plan: FaultPlan, sleep: Callable[[float], None] = time.sleep) -> None:
        self.plan = plan
        self._sleep = sleep
        self._lock = threading.Lock()
        self._rng = random.Random(plan.seed)
        self.calls = 0
        self.kills = 0
        self.hangs = 0

    def before_call(self, what: str) -> None:
        """Count one call; kill or hang it if the plan says so."""
        plan = self.plan
        with self._lock:
            self.calls += 1
            n = self.calls
            kill = n in plan.kill_on_calls or (plan.kill_probability > 0
                                               and self._rng.random() < plan.kill_probability)
            hang = not kill and (n in plan.hang_on_calls or (
                plan.hang_probability > 0 and self._rng.random() < plan.hang_probability))
            self.kills += kill
            self.hangs += hang
        if kill:
            raise WorkerKilled(f"injected: {what} call {n} kills its worker thread")
        if hang:
            self._sleep(plan.hang_s)

    def arm(self, model: GenerativeModel | OneShotModel) -> None:
        """Route the model's ``forward`` (generative) or ``run_batch`` (one-shot) through
        ``before_call``."""
        name = "forward" if isinstance(model, GenerativeModel) else "run_batch"
        inner = getattr(model, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            self.before_call(name)
            return inner(*args, **kwargs)

        setattr(model, name, call)


__all__ = ["FaultInjector", "FaultPlan", "WorkerKilled"]
