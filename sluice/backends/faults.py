"""Fault injection for the tests and the chaos bench: make a loaded model kill its worker's
thread or hang inside ``forward`` / ``run_batch``, on chosen calls or at random.

A kill is an exception by default (``kill_mode = "raise"``: the worker's thread ends, as a
bug outside every barrier would end it). With ``workers.isolation = "process"`` it may
instead end the worker's process as a crash in C code would: ``abort`` (``os.abort()``,
SIGABRT), ``segv`` (SIGSEGV sent to itself) or ``sigkill``. Those modes are refused in
thread mode (``sluice.config``): they would end the whole server.

A ``FaultPlan`` is configuration (``[models.faults]``, never set in production). A
``FaultInjector`` is its live state: one per model id for the life of the runtime, shared
by every load of that model, so call numbers count across a dead worker and its
replacement (``kill_on_calls = [3]`` kills one worker once; the replacement serves) and the
random draws go on from one seeded stream. In process mode the injector crosses to each
worker process with a counter in shared memory (``shared``), so the numbering spans the
processes too, and each random draw is seeded by the plan's seed and the call's number
(the same calls fail whichever process makes them). ``arm`` wraps a loaded model's call in place;
the backend knows nothing about it, so the same plan works on every backend.
"""

from __future__ import annotations

import multiprocessing.context
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from sluice.backends.base import GenerativeModel, OneShotModel

KillMode = Literal["raise", "abort", "segv", "sigkill"]
PROCESS_KILL_MODES: frozenset[str] = frozenset({"abort", "segv", "sigkill"})
"""Kill modes that end the process: only with ``workers.isolation = "process"``."""


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
    kill_mode: KillMode = "raise"
    """How a kill ends the worker: ``raise`` ``WorkerKilled`` (its thread), or end its
    process: ``abort`` (``os.abort()``), ``segv`` (SIGSEGV), ``sigkill`` (SIGKILL)."""

    def __post_init__(self) -> None:
        if self.kill_mode not in ("raise", *PROCESS_KILL_MODES):
            raise ValueError(f"faults.kill_mode must be raise, abort, segv or sigkill, got "
                             f"{self.kill_mode!r}")
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
        self._shared: Any = None
        """In process mode: the call counter in shared memory (``shared``)."""
        self._calls = 0
        self.kills = 0
        """Kills drawn by this copy (in process mode: by this process)."""
        self.hangs = 0

    @property
    def calls(self) -> int:
        """Calls counted so far (for a ``shared`` injector: by every process)."""
        return self._calls if self._shared is None else int(self._shared.value)

    @classmethod
    def shared(cls, plan: FaultPlan, context: multiprocessing.context.BaseContext
               ) -> FaultInjector:
        """An injector whose call count lives in shared memory of ``context``, for worker
        processes: pickled into each one as it starts, every copy counts on one number."""
        injector = cls(plan)
        injector._shared = context.Value("q", 0)
        return injector

    def __getstate__(self) -> dict[str, Any]:
        if self._shared is None:
            raise TypeError("only a FaultInjector.shared injector crosses to a process")
        return {"plan": self.plan, "shared": self._shared}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["plan"])  # type: ignore[misc]
        self._shared = state["shared"]

    def _count(self) -> tuple[int, random.Random]:
        """The call's number, and the stream its random draws come from (lock held)."""
        if self._shared is None:
            self._calls += 1
            return self._calls, self._rng
        with self._shared.get_lock():
            self._shared.value += 1
            n = int(self._shared.value)
        return n, random.Random(f"{self.plan.seed}:{n}")

    def before_call(self, what: str) -> None:
        """Count one call; kill or hang it if the plan says so."""
        plan = self.plan
        with self._lock:
            n, rng = self._count()
            kill = n in plan.kill_on_calls or (plan.kill_probability > 0
                                               and rng.random() < plan.kill_probability)
            hang = not kill and (n in plan.hang_on_calls or (
                plan.hang_probability > 0 and rng.random() < plan.hang_probability))
            self.kills += kill
            self.hangs += hang
        if kill:
            _kill(plan.kill_mode, f"injected: {what} call {n} kills its worker")
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


def _kill(mode: KillMode, message: str) -> None:
    """End the worker as ``mode`` says (see ``FaultPlan.kill_mode``)."""
    if mode == "abort":
        os.abort()
    if mode in ("segv", "sigkill"):
        os.kill(os.getpid(), signal.SIGSEGV if mode == "segv" else signal.SIGKILL)
        time.sleep(60.0)  # the signal is delivered at once; never go on running the call
    raise WorkerKilled(f"{message} thread")


__all__ = ["PROCESS_KILL_MODES", "FaultInjector", "FaultPlan", "KillMode", "WorkerKilled"]
