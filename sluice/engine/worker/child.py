"""The worker process's side of process isolation (``workers.isolation = "process"``):
``serve`` is the target of the child process that ``process.ProcessWorker`` starts. It
builds an ordinary ``Worker`` over its own backends and engines and connects it to the
control plane by one duplex pipe:

- the process's main thread reads the pipe and puts what it reads into the worker's
  mailbox (``Worker.accept`` for a ``Run``, ``Worker.post`` for every other inbound
  message); a ``stop`` ends the worker as in thread mode (its requests are cancelled, its
  models closed), then the process exits 0; the pipe's end (the server died) does too;
- the worker's ``_flush`` sends each run of outbound messages down the pipe
  (``PipeOutbox``) with the inbox's depth and how many ``Run`` it has taken, so the proxy
  can say how full the inbox is without asking; a heartbeat rides along, and one that
  allows more than a step (a load, an idle wait, an admin call) is sent at once;
- a death of the worker's thread sends its ``WorkerFault`` and ends the process (exit code
  70); a death of the process itself (SIGSEGV, ``os.abort()``, SIGKILL) is what the
  proxy sees as the pipe's end. ``faulthandler`` prints the Python stack of a fatal
  signal to the process's stderr (the server's log).
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import threading
import time
from collections.abc import Mapping
from multiprocessing.connection import Connection
from typing import Any

from sluice.backends.base import Backend, ModelSpec
from sluice.backends.faults import FaultInjector
from sluice.engine.messages import Outbound, Reply, Run
from sluice.engine.worker import Worker
from sluice.policy.worker_config import WorkerConfig

THREAD_DIED_EXIT = 70
"""The exit code of a worker process whose worker thread died of an exception."""

SENT_AT_ONCE = frozenset({"load", "first step", "admin call", "idle", "starting"})
"""Heartbeat activities sent as soon as stamped (the others ride on the next flush)."""


class PipeOutbox:
    """The outbox a worker process's ``Worker`` puts its runs of messages on: each goes
    down the pipe as ``("out", messages, inbox depth, runs taken, heartbeat)``. Sends are
    serialized by a lock (the worker's thread and the main thread both send)."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self.worker: ChildWorker | None = None

    def put(self, entry: tuple[Any, tuple[Outbound, ...]]) -> None:
        worker = self.worker
        assert worker is not None
        depth, taken = worker.depth_and_taken()
        self.send(("out", entry[1], depth, taken, worker.heartbeat))

    def send(self, message: tuple[Any, ...]) -> None:
        """Send ``message``; a ``Reply`` whose result or error does not pickle goes as an
        error that says so."""
        try:
            data = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
        except Exception:  # a Reply's payload, the one part of a message code chooses
            data = pickle.dumps(_picklable(message), pickle.HIGHEST_PROTOCOL)
        with self._lock:
            self._conn.send_bytes(data)


def _picklable(message: tuple[Any, ...]) -> tuple[Any, ...]:
    if message[0] != "out":
        raise TypeError(f"worker process: cannot send {message[0]!r}")
    fixed = []
    for m in message[1]:
        if isinstance(m, Reply):
            try:
                pickle.dumps(m)
            except Exception as exc:
                m = Reply(m.call_id, error=RuntimeError(
                    f"the worker process's answer does not pickle: {type(exc).__name__}: "
                    f"{exc}; the call's result was {type(m.result).__name__}, its error "
                    f"{m.error!r}"))
        fixed.append(m)
    return (message[0], tuple(fixed), *message[2:])


class ChildWorker(Worker):
    """A ``Worker`` in a worker process: it counts the ``Run`` it takes and sends the
    heartbeats that allow long work at once."""

    taken: int = 0
    """``Run`` messages taken into the inbox so far (lock)."""
    pipe: PipeOutbox

    def accept(self, run: Run) -> None:
        with self._cv:
            self.taken += 1
            super().accept(run)

    def depth_and_taken(self) -> tuple[int, int]:
        with self._cv:
            return self._queue_depth(), self.taken

    def _beat(self, activity: str, allowance_s: float) -> None:
        super()._beat(activity, allowance_s)
        if activity in SENT_AT_ONCE:
            self.pipe.send(("beat", self.heartbeat))


def serve(conn: Connection, config: WorkerConfig, specs: Mapping[str, ModelSpec],
          backends: Mapping[str, Backend], faults: Mapping[str, FaultInjector]) -> None:
    """The worker process's main (see the module docstring). Its clock is
    ``time.monotonic``, the one clock every process on the machine shares."""
    faulthandler.enable()
    pipe = PipeOutbox(conn)

    def died() -> None:
        try:
            pipe.send(("fault", worker.fault))
        finally:
            os._exit(THREAD_DIED_EXIT)

    worker = ChildWorker(config, specs, backends, time.monotonic,
                         pipe, faults=faults, on_death=died)  # type: ignore[arg-type]
    worker.pipe = pipe
    pipe.worker = worker
    worker.start()
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the control plane is gone
            break
        kind = message[0]
        if kind == "run":
            worker.accept(message[1])
        elif kind == "post":
            worker.post(message[1])
        elif kind == "wake":
            worker.wake()
        else:
            assert kind == "stop", kind
            break
    worker.stop()
    worker.join(30.0)
    conn.close()
