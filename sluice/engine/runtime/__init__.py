"""The control plane: admit → schedule → route, with one dispatcher thread.

``try_submit`` admits or rejects at once (bounded queue, never a hang); ``submit`` waits
for room. The dispatcher thread pops ONE request at a time from the scheduler, asks the
router for a worker, and offers it to that worker's bounded inbox. It pops only while
some inbox has room; a request whose feasible workers are all full goes back into the
scheduler (keeping its place, its fair-share charge refunded) until capacity frees up.
Deadlines of queued requests are watched here; workers watch those they hold. What the
workers report comes back as messages that one pump thread applies (``pump``).

Every admitted request ends in exactly one terminal state: the request state machine
guarantees "first terminal wins", and ``stop`` drains, then cancels whatever is left. A
worker that dies or stalls is replaced by the ``Supervisor`` (``sluice.engine.supervisor``),
which ends the requests it held; ``health`` says whether every thread is doing its job.

``Runtime`` is composed of one mixin per concern, each in its own module over the state
that ``state.RuntimeState`` declares (all of it guarded by one condition variable); the queue,
dispatch, re-planning and fair-share settlement are one ``ControlCore``
(``sluice.policy.queues.control_core``), which the simulator's replica drives too:
``factory`` (requests and the tokenizer cache), ``admission`` (submit, cancel, the variant
choice at arrival), ``settlement`` (a finished request leaves the live set and its
fair-share charge is corrected), ``pump`` (the thread that applies the workers' messages),
``deadlines`` (the heap of queued requests' start-by
times), ``dispatch`` (the dispatcher thread: expire, replan, route), ``lifecycle``
(start, drain, stop, health, snapshots, worker replacement), ``admin`` (load, unload,
slots, engine calls) and ``async_api`` (the asyncio conveniences; ``AsyncHandle`` lives in
``sluice.engine.bridge`` and is re-exported here).
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Mapping

from sluice.backends.base import Backend
from sluice.backends.faults import FaultInjector
from sluice.engine.bridge import AsyncHandle
from sluice.engine.observer import Observer
from sluice.engine.runtime.admin import Admin
from sluice.engine.runtime.async_api import AsyncAPI, Rejected
from sluice.engine.runtime.config import RuntimeConfig
from sluice.engine.runtime.deadlines import DEADLINE_SLACK
from sluice.engine.runtime.dispatch import Dispatch
from sluice.engine.runtime.lifecycle import Lifecycle, RuntimeHealth, RuntimeSnapshot
from sluice.engine.supervisor import Supervisor
from sluice.engine.trace import TraceWriter
from sluice.engine.variants import VariantPlanner
from sluice.engine.worker.process import CONTEXT as PROCESS_CONTEXT
from sluice.policy.queues.control_core import ControlCore

MAX_SUPERVISOR_POLL_S = 0.25
"""The supervisor checks heartbeats at least this often (a death wakes it at once)."""


class Runtime(AsyncAPI, Dispatch, Lifecycle, Admin):
    """Owns the queue, the dispatcher and pump threads and the workers. Thread-safe."""

    def __init__(
        self,
        config: RuntimeConfig,
        backends: Mapping[str, Backend],
        *,
        clock: Callable[[], float] = time.monotonic,
        observer: Observer | None = None,
    ) -> None:
        self.config = config
        self.specs = {m.model_id: m for m in config.models}
        self._backends = backends
        self.clock = clock
        self.observer = observer or Observer()
        self._cv = threading.Condition(threading.RLock())
        self._core = ControlCore(config.queue)
        self._scheduler = self._core.scheduler
        self._dispatcher = self._core.dispatcher
        self._router = self._dispatcher.router
        self._trace = (TraceWriter(config.trace_path, clock()) if config.trace_path is not None
                       else None)
        self._deadlines = []
        self._live = {}
        self._moving = set()
        self._ids = itertools.count(1)
        self._tokenizers = {}
        self.variants = VariantPlanner(config.groups, self.specs,
                                       [w.budget_bytes for w in config.workers], clock)
        self._outbox = queue.SimpleQueue()
        self._pump = threading.Thread(target=self._pump_loop, name="sluice-pump", daemon=True)
        self.pump_fault = None
        if config.isolation == "process" and clock is not time.monotonic:
            raise ValueError("isolation = 'process' needs the clock time.monotonic (the one "
                             "clock the worker processes share)")
        self._faults = {m: (FaultInjector.shared(plan, PROCESS_CONTEXT)
                            if config.isolation == "process" else FaultInjector(plan))
                        for m, plan in config.faults.items()}
        self._draining = False
        self._stopped = False
        self.dispatcher_fault = None
        self.supervisor = Supervisor(
            lambda: self.workers, self._replace_worker, self._end_held, self._await_applied,
            clock, self.observer,
            poll_s=min(MAX_SUPERVISOR_POLL_S,
                       min(w.watchdog_s for w in config.workers) / 4))
        self.workers = [self._new_worker(w) for w in config.workers]
        self._thread = threading.Thread(target=self._dispatch_loop, name="sluice-dispatch",
                                        daemon=True)


__all__ = [
    "DEADLINE_SLACK",
    "AsyncHandle",
    "Rejected",
    "Runtime",
    "RuntimeConfig",
    "RuntimeHealth",
    "RuntimeSnapshot",
]
