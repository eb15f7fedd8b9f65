"""Worker supervision: notice a worker that died or stalls, end its requests, replace it.

A worker is declared dead when its execution thread ended of an exception
(``Worker.fault``), when its process ended (process isolation: ``ProcessWorker.fault``,
set the moment its pipe ends), or when it holds work and its heartbeat is overdue (``stalled``: the
thread began a step, a batch or a load and has not come back within the allowance it
stamped, ``workers.watchdog_s`` or ``workers.load_watchdog_s``). Then, in this order:

1. the worker is abandoned: it refuses new work, and its thread, if it ever comes back,
   ends and closes its models (a stalled worker process is killed);
2. every request it held ends at once in one terminal state (FAILED, ``worker_failed``,
   the cause in the message);
3. its traceback (or, for a stall, where its thread is stuck) is logged once;
4. a new worker with the same id and limits takes its place (with process isolation a new
   worker process, which boots first) and loads the models the dead one held. Until it
   serves and those loads end the worker is ``recovering``: ``sluice_worker_up`` is 0 and
   ``/ready`` is 503. Requests routed to it meanwhile wait in its inbox.

The supervisor is one thread that sleeps between checks (a dying worker wakes it at once),
so it costs the decode loop nothing measurable. ``stalled`` and ``worker_status`` are plain
functions of what they are given, tested without threads.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Literal

from sluice.engine.observer import Observer
from sluice.engine.worker import Heartbeat
from sluice.engine.worker.process import AnyWorker

log = logging.getLogger("sluice.supervisor")

WorkerStatus = Literal["up", "recovering", "dead", "stopped"]

RECOVERY_LOG = 100
"""Recoveries kept for the status page."""


def stalled(beat: Heartbeat, holds_work: bool, now: float) -> bool:
    """A worker that holds work and whose last heartbeat is past its allowance."""
    return holds_work and beat.overdue_s(now) > 0


def worker_status(alive: bool, has_fault: bool, stopped_on_purpose: bool,
                  recovering: bool, supervised: bool) -> WorkerStatus:
    """What ``/health``, ``/ready`` and ``sluice_worker_up`` say about one worker slot:
    ``recovering`` while a replacement loads (or a dead worker is about to be replaced by a
    running supervisor), ``up`` while its thread runs, ``stopped`` after ``stop``, else
    ``dead`` (its thread ended and nothing replaces it)."""
    if recovering or (has_fault and supervised):
        return "recovering"
    if alive:
        return "up"
    return "stopped" if stopped_on_purpose else "dead"


@dataclass(frozen=True, slots=True)
class Recovery:
    """One replaced worker, for the status page and the chaos bench."""

    worker_id: int
    cause: str
    failed_requests: int
    detect_s: float
    """Death (the thread's end, or the stalled heartbeat's stamp) → declared dead."""
    recovery_s: float | None = None
    """Death → the replacement had loaded the dead worker's models (None while loading)."""
    models: tuple[str, ...] = ()


@dataclass
class _Pending:
    """A replacement still loading."""

    index: int
    died_s: float
    record: Recovery
    loads: list[Future[object]] | None = None
    """The replacement's loads (None until it is in place), after its ``ready`` (a worker
    process boots first)."""


class Supervisor:
    """Watches ``workers()`` from its own thread; see the module docstring."""

    def __init__(
        self,
        workers: Callable[[], Sequence[AnyWorker]],
        replace: Callable[[int], AnyWorker],
        end_held: Callable[[int, str], int],
        applied: Callable[[AnyWorker], bool],
        clock: Callable[[], float],
        observer: Observer,
        poll_s: float,
    ) -> None:
        """``replace(index)`` builds and starts a new worker in slot ``index`` (same id and
        limits) and returns it; ``end_held(worker_id, message)`` ends the live requests
        routed to that worker and returns how many it ended; ``applied(worker)`` returns
        once the control side has applied every message the worker sent (a dead worker's
        residency is read after it, so its replacement loads what it held)."""
        self._workers = workers
        self._replace = replace
        self._end_held = end_held
        self._applied = applied
        self._clock = clock
        self._observer = observer
        self._poll_s = poll_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        """Slot index → its replacement's loads (lock held)."""
        self.recoveries: deque[Recovery] = deque(maxlen=RECOVERY_LOG)
        self.fault: str | None = None
        """Set if the supervisor's own thread failed (``/health`` then fails)."""
        self._thread = threading.Thread(target=self._run, name="sluice-supervisor",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(5.0)

    def wake(self) -> None:
        """Check now (a worker's thread is dying)."""
        self._wake.set()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.fault is None

    def statuses(self) -> tuple[WorkerStatus, ...]:
        """Each worker slot's status, in slot order."""
        supervised = self.alive and not self._stop.is_set()
        with self._lock:
            recovering = set(self._pending)
        return tuple(
            worker_status(w.is_alive(), w.fault is not None, w.stopped_on_purpose,
                          i in recovering, supervised)
            for i, w in enumerate(self._workers()))

    # -- the supervisor's thread ---------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._wake.wait(self._poll_s)
                self._wake.clear()
                if self._stop.is_set():
                    return
                self.check()
        except BaseException as exc:  # /health reports it from now on
            self.fault = type(exc).__name__
            log.exception("the worker supervisor failed; workers are no longer supervised")

    def check(self) -> None:
        """One pass: replace every dead or stalled worker, note finished recoveries."""
        now = self._clock()
        for index, worker in enumerate(self._workers()):
            if worker.abandoned or worker.stopped_on_purpose:
                continue
            if worker.fault is not None and not worker.is_alive():
                fault = worker.fault
                self._take_over(index, worker, fault.cause, fault.time_s, fault.detail)
            elif stalled(worker.heartbeat, worker.holds_work(), now):
                beat = worker.heartbeat
                cause = (f"stopped making progress ({beat.activity} for more than "
                         f"{beat.allowance_s:g} s)")
                stack = worker.stack()
                self._take_over(index, worker, cause, beat.stamp_s,
                                f"its thread is stuck here:\n{stack}")
        self._note_recovered()

    def _take_over(self, index: int, worker: AnyWorker, cause: str, died_s: float,
                   detail: str) -> None:
        worker_id = worker.config.worker_id
        worker.abandon(f"worker {worker_id} failed: {cause}")
        failed = self._end_held(
            worker_id, f"worker {worker_id} {cause}; this request was ended and the worker "
                       "is being replaced")
        detected_s = self._clock()
        log.error("worker %d %s; %d request(s) ended, replacing it\n%s", worker_id, cause,
                  failed, detail.rstrip())
        self._observer.worker_died(worker_id, "died" if worker.fault else "stalled", failed)
        if not worker.is_alive():
            worker.close_models()
            if not self._applied(worker):
                log.warning("worker %d: its last messages were not applied in time; its "
                            "replacement loads the models known so far", worker_id)
        models = tuple(sorted(worker.state.resident))
        record = Recovery(worker_id, cause, failed, detected_s - died_s, models=models)
        pending = _Pending(index, died_s, record)
        with self._lock:  # recovering from before the replacement is in place
            self._pending[index] = pending
        replacement = self._replace(index)
        loads = [replacement.ready(), *(replacement.load(m) for m in models)]
        with self._lock:
            pending.loads = loads
        for fut in loads:
            fut.add_done_callback(lambda _: self._wake.set())

    def _note_recovered(self) -> None:
        now = self._clock()
        with self._lock:
            done = [p for p in self._pending.values()
                    if p.loads is not None and all(f.done() for f in p.loads)]
            for p in done:
                del self._pending[p.index]
        for p in done:
            seconds = now - p.died_s
            model_loads = (p.loads or [])[1:]  # after the replacement's ready
            failed_loads = [m for m, f in zip(p.record.models, model_loads, strict=True)
                            if f.exception() is not None]
            if failed_loads:
                log.error("worker %d replacement could not load %s", p.record.worker_id,
                          failed_loads)
            self.recoveries.append(Recovery(
                p.record.worker_id, p.record.cause, p.record.failed_requests,
                p.record.detect_s, seconds, p.record.models))
            self._observer.worker_recovered(p.record.worker_id, seconds)
            log.warning("worker %d replaced: serving again %.3f s after it failed",
                        p.record.worker_id, seconds)


__all__ = ["Recovery", "Supervisor", "WorkerStatus", "stalled", "worker_status"]
