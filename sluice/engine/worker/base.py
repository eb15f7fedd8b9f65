"""``WorkerBase``: the fields every part of a worker reads, declared once, and the small
helpers they share. Two sides touch them: the control plane (``control``: any thread) and
the worker's own thread (``loop``, ``models``). What both touch is guarded by ``_cv`` and
said so below; everything else belongs to one side."""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from sluice.backends.base import Backend, GenerativeModel, ModelSpec, OneShotModel
from sluice.backends.faults import FaultInjector
from sluice.engine.continuous import ContinuousEngine
from sluice.engine.messages import Done, Inbound, Outbound, Run
from sluice.engine.oneshot import OneShotExecutor
from sluice.engine.request import Request
from sluice.engine.work_item import WorkItem
from sluice.engine.worker.calls import Calls
from sluice.engine.worker.types import Heartbeat, WorkerFault, WorkerState
from sluice.policy.capacity.residency import Residency
from sluice.policy.worker_config import WorkerConfig

Outbox = queue.SimpleQueue[tuple[Any, tuple[Outbound, ...]]]
"""The runtime's outbox: (the sending worker, a run of its messages), in the order sent."""


class WorkerBase:
    """A worker's fields (``Worker.__init__`` sets them)."""

    config: WorkerConfig
    _specs: Mapping[str, ModelSpec]
    _backends: Mapping[str, Backend]
    _clock: Callable[[], float]
    _outbox: Outbox
    _faults: Mapping[str, FaultInjector]
    _on_death: Callable[[], None]
    _cv: threading.Condition
    """Guards the fields marked "(lock)": the mailbox both sides use."""
    _inbox: deque[Run]
    """(lock) ``Run`` messages whose items are not yet in an engine or a batch."""
    _controls: deque[Inbound]
    """(lock) Inbound messages for the thread's next loop."""
    _calls: Calls
    """``Load``, ``Unload``, ``AdminCall`` and ``Call`` messages not yet answered (its own
    lock)."""
    _dirty: bool
    """(lock) Something arrived since the thread last looked."""
    _stopping: bool
    """(lock) ``stop`` or ``abandon`` was called."""
    _engine_waiting: int
    """(lock) Items moved into engines and not yet running (raised on every move,
    recomputed after every loop, so it never undercounts)."""
    routed: dict[int, Request]
    """The clients' requests whose items were given to this worker, by id (control side:
    written at ``offer``, read and emptied by the runtime's pump; single dict operations,
    atomic under the GIL)."""
    abandoned: bool
    fault: WorkerFault | None
    heartbeat: Heartbeat
    state: WorkerState
    """The last snapshot the pump took from a ``State`` message (control side)."""
    trace: list[tuple[str, tuple[int, ...]]] | None
    """(lock) When a list, every inbox change is appended (tests replay it): ``("offer",
    (id,))``, ``("leave", (id,))``, ``("engine", (id,))``, ``("batch", ids)``."""
    # The worker thread's own:
    _residency: Residency
    _models: dict[str, OneShotModel | GenerativeModel]
    _engines: dict[str, ContinuousEngine]
    _failed: dict[str, str]
    _loaded_at_s: dict[str, float]
    _oneshot: OneShotExecutor
    _outgoing: list[Outbound]
    """Messages sent since the last ``_flush``."""
    _running: dict[int, WorkItem]
    """Items in an engine or a batch, by id (until their ``Done``)."""
    _idle_asked_s: dict[str, float]
    """Models asked about in ``IdleModels`` → when (asked again at most every
    ``IDLE_POLL_S`` while the runtime says they are needed)."""
    _thread: threading.Thread

    def _send(self, message: Outbound) -> None:
        """Queue ``message``; it leaves at the next ``_flush``."""
        self._outgoing.append(message)

    def _send_item(self, message: Outbound) -> None:
        """What the worker's items send: their ``Done`` ends the worker's hold on them."""
        if isinstance(message, Done):
            self._running.pop(message.request_id, None)
        self._outgoing.append(message)

    def _flush(self) -> None:
        """Put what was sent on the outbox as one run: after every engine step, every loop
        and every control message, and before anything long (a load, a one-shot batch),
        so a step's tokens cost the pump one wake-up, not one each."""
        if self._outgoing:
            self._outbox.put((self, tuple(self._outgoing)))
            self._outgoing.clear()

    def _trace(self, what: str, *items: Request) -> None:
        """Record an inbox change (lock held)."""
        if self.trace is not None:
            self.trace.append((what, tuple(r.request_id for r in items)))

    def _queue_depth(self) -> int:
        """(lock) Items waiting here: in the inbox or in an engine's line."""
        return len(self._inbox) + self._engine_waiting

    def _beat(self, activity: str, allowance_s: float) -> None:
        """Stamp the heartbeat: ``activity`` begins now and may take ``allowance_s``."""
        self.heartbeat = Heartbeat(self._clock(), allowance_s, activity)
