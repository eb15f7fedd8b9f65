"""``RuntimeState``: the state every part of the runtime reads, declared once, and the
small queries they share. Every mutable field is guarded by ``_cv`` (one re-entrant
condition variable); a waiter is woken by ``_cv.notify_all`` whenever the queue, the
live set or the workers change. Lock order is runtime → worker."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping

from sluice.backends.base import Backend, ModelSpec, Tokenizer
from sluice.backends.faults import FaultInjector
from sluice.engine.observer import Observer
from sluice.engine.request import Request
from sluice.engine.runtime.config import RuntimeConfig
from sluice.engine.supervisor import Supervisor
from sluice.engine.trace import TraceWriter
from sluice.engine.variants import VariantPlanner
from sluice.engine.worker import Outbox
from sluice.engine.worker.process import AnyWorker
from sluice.policy.queues.control_core import ControlCore
from sluice.policy.queues.dispatch import Dispatcher
from sluice.policy.queues.router import Router
from sluice.policy.queues.scheduler import Scheduler

IDLE_POLL_S = 0.5
"""The longest a waiter on ``_cv`` sleeps before it looks again."""


class RuntimeState:
    """The runtime's fields (``Runtime.__init__`` sets them) and the queries every part
    uses. No method here blocks."""

    config: RuntimeConfig
    specs: dict[str, ModelSpec]
    """The configured models by id (a group's variants included)."""
    _backends: Mapping[str, Backend]
    clock: Callable[[], float]
    observer: Observer
    _cv: threading.Condition
    """Guards every mutable field below."""
    _core: ControlCore
    """Admission, the queue, dispatch, re-planning and fair-share settlement (shared with
    the simulator's replica); the three below are its parts."""
    _scheduler: Scheduler
    """The queue: admitted requests not yet offered to a worker."""
    _router: Router
    _dispatcher: Dispatcher
    _trace: TraceWriter | None
    _deadlines: list[tuple[float, int]]
    """A heap of (start-by time, request id) of queued requests; entries of finished ones
    stay until purged (``Deadlines._purge_deadlines``)."""
    _live: dict[int, Request]
    """Admitted requests not yet finished (queued, routed or running)."""
    _moving: set[int]
    """Requests in an inbox whose move to another variant the worker has yet to make."""
    _ids: Iterator[int]
    _tokenizers: dict[str, Tokenizer]
    variants: VariantPlanner
    _outbox: Outbox
    """Every worker's outbound messages, for the pump (``pump``)."""
    _pump: threading.Thread
    pump_fault: str | None
    """Set if the pump thread failed (``/health`` then fails)."""
    _faults: dict[str, FaultInjector]
    _draining: bool
    _stopped: bool
    dispatcher_fault: str | None
    """Set if the dispatcher thread failed (``/health`` then fails)."""
    supervisor: Supervisor
    workers: list[AnyWorker]
    _thread: threading.Thread
    """The dispatcher thread."""

    def _queue_depth(self) -> int:
        return len(self._scheduler)

    def spec_for(self, name: str) -> ModelSpec | None:
        """A model's spec; for a model group, its first variant's (kind and task)."""
        spec = self.specs.get(name)
        if spec is None and name in self.variants.groups:
            spec = self.variants.lead_spec(name)
        return spec

    def _notify(self) -> None:
        with self._cv:
            self._cv.notify_all()

    def _model_bytes(self, model_id: str) -> int:
        return self.specs[model_id].memory_bytes

    def _is_live(self, request_id: int) -> bool:
        req = self._live.get(request_id)
        return req is not None and not req.is_terminal
