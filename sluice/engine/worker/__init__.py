"""A worker: one execution thread that owns a resident set, its loaded models, a
continuous-batching engine per resident generative model, and one one-shot executor
(``sluice.engine.oneshot``) for its one-shot models.

Worker and control plane talk in messages (``sluice.engine.messages``). The control plane
puts inbound ones in the worker's mailbox (``control``): a ``Run`` carries a ``WorkItem``,
the worker's own copy of a request, into the bounded inbox; ``Cancel``, ``Retarget``,
``Load``, ``Unload`` and ``UnloadIdle`` name requests and models by id. The thread
(``loop``, ``models``) sends outbound ones onto the runtime's outbox, whose pump
(``sluice.engine.runtime.pump``) applies them; it never calls into the runtime, and takes
no lock but its own mailbox's. ``supervisor`` reads the thread's ``Heartbeat``.

``Worker`` is composed of one mixin per side over the fields ``base.WorkerBase`` declares:
``control`` (the control plane's calls, any thread), ``loop`` (the thread's loop and its
inbound messages) and ``models`` (residency, admin operations, the published state);
``types`` holds the snapshots; its configuration is ``sluice.policy.worker_config.WorkerConfig``,
which the simulator's workers run on too.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping

from sluice.backends.base import Backend, ModelSpec
from sluice.backends.faults import FaultInjector
from sluice.engine.oneshot import OneShotExecutor
from sluice.engine.worker.base import Outbox
from sluice.engine.worker.calls import Calls
from sluice.engine.worker.control import Control
from sluice.engine.worker.loop import Loop
from sluice.engine.worker.types import (
    IDLE_POLL_S,
    Heartbeat,
    ModelState,
    WorkerFault,
    WorkerState,
    spec_keep_alive,
)
from sluice.policy.capacity.residency import Residency
from sluice.policy.worker_config import WorkerConfig


class Worker(Control, Loop):
    """Owns one thread; see the module docstring for the protocol."""

    def __init__(
        self,
        config: WorkerConfig,
        specs: Mapping[str, ModelSpec],
        backends: Mapping[str, Backend],
        clock: Callable[[], float],
        outbox: Outbox,
        *,
        faults: Mapping[str, FaultInjector] | None = None,
        on_death: Callable[[], None] = lambda: None,
    ) -> None:
        """``outbox``: where its outbound messages go (with the worker as their sender);
        ``faults``: injectors armed on the models they name as they load (tests, chaos
        bench); ``on_death``: called from the thread as it dies (wakes the supervisor)."""
        self.config = config
        self._specs = specs
        self._backends = backends
        self._clock = clock
        self._outbox = outbox
        self._faults = faults or {}
        self._on_death = on_death
        self._cv = threading.Condition()
        self._inbox = deque()
        self._controls = deque()
        self._calls = Calls()
        self._dirty = False
        self._stopping = False
        self._engine_waiting = 0
        self.routed = {}
        self.abandoned = False
        """Given up by the supervisor (lock held to write): refuses work, never serves again."""
        self.fault = None
        """Set by the thread as it dies of an exception."""
        self.heartbeat = Heartbeat(clock(), config.load_watchdog_s, "starting")
        self.state = WorkerState(worker_id=config.worker_id, budget_bytes=config.budget_bytes)
        self.trace = None
        self._residency = Residency(config.budget_bytes, config.eviction)
        self._models = {}
        self._engines = {}
        self._failed = {}
        self._loaded_at_s = {}
        self._outgoing = []
        self._running = {}
        self._idle_asked_s = {}
        self._oneshot = OneShotExecutor(
            max_batch_size=config.max_batch_size,
            max_wait_s=config.max_wait_s,
            clock=clock,
            send=self._send,
            on_start=self._batch_started,
            on_end=self._batch_ended,
        )
        self._thread = threading.Thread(
            target=self._run, name=f"sluice-worker-{config.worker_id}", daemon=True
        )


__all__ = [
    "IDLE_POLL_S",
    "Heartbeat",
    "ModelState",
    "Outbox",
    "Worker",
    "WorkerFault",
    "WorkerState",
    "spec_keep_alive",
]
