"""The runtime's life: start, drain, stop; what it reports of itself (``snapshot`` for
/status and /metrics, ``health`` for /health and /ready); and the supervisor's hooks that
replace a dead worker and end the requests it held."""

from __future__ import annotations

from dataclasses import dataclass

from sluice.engine.request import RequestStatus
from sluice.engine.runtime.pump import Pump
from sluice.engine.supervisor import Recovery, WorkerStatus
from sluice.engine.worker import Worker, WorkerState
from sluice.engine.worker.process import AnyWorker, ProcessWorker
from sluice.policy.worker_config import WorkerConfig


@dataclass(frozen=True)
class RuntimeSnapshot:
    """The runtime at one instant, for /status and /metrics."""

    queue_depth: int
    queue_capacity: int
    live_requests: int
    draining: bool
    completions_per_s: float
    workers: tuple[WorkerState, ...]
    inbox_depths: tuple[int, ...]
    worker_status: tuple[WorkerStatus, ...] = ()
    """Per worker slot: ``up``, ``recovering``, ``dead`` or ``stopped``."""


@dataclass(frozen=True)
class RuntimeHealth:
    """Whether the runtime's threads do their jobs (``/health``, ``/ready``)."""

    alive: bool
    """The dispatcher and the supervisor run, and no worker is dead without a replacement
    on the way."""
    workers: tuple[WorkerStatus, ...]
    problem: str = ""
    """What is wrong when not ``alive`` (or which worker recovers)."""

    @property
    def all_up(self) -> bool:
        return all(s == "up" for s in self.workers)


class Lifecycle(Pump):
    """Starting and stopping the threads (the pump's among them), health, snapshots and
    worker replacement."""

    def start(self) -> None:
        self._pump.start()
        for w in self.workers:
            w.start()
        self._thread.start()
        self.supervisor.start()

    def stop(self, drain_timeout_s: float = 10.0) -> int:
        """Stop admitting, let in-flight work finish for up to ``drain_timeout_s``, then
        cancel what is left. Returns how many requests had to be cancelled."""
        deadline = self.clock() + drain_timeout_s
        with self._cv:
            self._draining = True
            while self._live and self.clock() < deadline:
                self._cv.wait(min(0.05, max(0.0, deadline - self.clock())))
            left = list(self._live.values())
            now = self.clock()
            for req in left:
                # Queued or running, the client is told why (``shutdown``); a running one's
                # worker frees its slot at its next step (first terminal state wins).
                self._scheduler.remove(req.request_id)
                req.cancel_requested = True
                req.finish(RequestStatus.CANCELLED, now, error="server shutting down",
                           error_code="shutdown")
            self._stopped = True
            self._cv.notify_all()
        self.supervisor.stop()
        for w in self.workers:
            w.stop()
        for w in self.workers:
            w.join(30.0)
        self._stop_pump()
        self._thread.join(5.0)
        if self._trace is not None:
            self._trace.close()
        return len(left)

    def begin_drain(self) -> None:
        """Refuse new requests from now on (503 ``draining``); in-flight work goes on."""
        with self._cv:
            self._draining = True
            self._cv.notify_all()

    @property
    def draining(self) -> bool:
        return self._draining

    def snapshot(self) -> RuntimeSnapshot:
        now = self.clock()
        with self._cv:
            depth = self._queue_depth()
            live = len(self._live)
            rate = self._core.completions.rate_per_s(now)
        workers = list(self.workers)
        return RuntimeSnapshot(
            queue_depth=depth,
            queue_capacity=self.config.queue.queue_capacity,
            live_requests=live,
            draining=self._draining,
            completions_per_s=rate,
            workers=tuple(w.state for w in workers),
            inbox_depths=tuple(w.inbox_depth() for w in workers),
            worker_status=self.supervisor.statuses(),
        )

    def health(self) -> RuntimeHealth:
        """Liveness: the dispatcher and supervisor threads run (until ``stop``) and every
        worker is up or being replaced."""
        statuses = self.supervisor.statuses()
        problem = ""
        if self._stopped:  # shutting down: the threads end on purpose
            return RuntimeHealth(alive=True, workers=statuses)
        if self.dispatcher_fault is not None or not self._thread.is_alive():
            problem = f"dispatcher thread is dead ({self.dispatcher_fault or 'ended'})"
        elif not self.supervisor.alive:
            problem = "worker supervisor is dead"
        elif self.pump_fault is not None or not self._pump.is_alive():
            problem = f"message pump thread is dead ({self.pump_fault or 'ended'})"
        for i, status in enumerate(statuses):
            if not problem and status in ("dead", "stopped"):
                problem = f"worker {i} is {status} and not being replaced"
        return RuntimeHealth(alive=not problem, workers=statuses, problem=problem)

    def recoveries(self) -> list[Recovery]:
        """Replaced workers, oldest first (the last ``RECOVERY_LOG``)."""
        return list(self.supervisor.recoveries)

    def completions_per_s(self) -> float:
        with self._cv:
            return self._core.completions.rate_per_s(self.clock())

    def _new_worker(self, config: WorkerConfig) -> AnyWorker:
        """A worker of the configured isolation: a thread here, or a process's proxy."""
        kind = ProcessWorker if self.config.isolation == "process" else Worker
        return kind(config, self.specs, self._backends, self.clock, self._outbox,
                    faults=self._faults, on_death=self.supervisor.wake)

    def _replace_worker(self, index: int) -> AnyWorker:
        """A fresh worker in slot ``index`` (same id and limits), started (supervisor)."""
        worker = self._new_worker(self.workers[index].config)
        with self._cv:
            self.workers[index] = worker
            worker.start()
            self._cv.notify_all()  # requests held back from the dead one may go there now
        return worker

    def _end_held(self, worker_id: int, message: str) -> int:
        """End (FAILED, ``worker_failed``) every live request routed to ``worker_id``,
        whose worker was abandoned (it takes no more); returns how many ended."""
        with self._cv:
            held = [r for r in self._live.values() if r.worker_id == worker_id]
        now = self.clock()
        return sum(r.finish(RequestStatus.FAILED, now, error=message,
                            error_code="worker_failed") for r in held)
