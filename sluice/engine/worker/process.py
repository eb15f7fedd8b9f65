"""Process isolation (``workers.isolation = "process"``): ``ProcessWorker`` is the control
plane's proxy for a worker that runs in a child process of its own (``child.serve``),
which owns its backends, models and engines. The proxy has the interface the runtime,
its pump and the supervisor use of a ``Worker`` (``offer``, ``post``, ``load``, ``ask``,
``view``, ``routed``, ``state``, ``heartbeat``, ``fault``, ...), so nothing above it knows
which mode it is in.

Inbound messages go down one duplex pipe (a ``Run`` carries a pickled ``WorkItem``); a
reader thread takes the child's runs of outbound messages off the pipe and puts them on
the runtime's outbox with the proxy as their sender, so the pump stays the outbox's only
reader and applies them exactly as a thread worker's. Each run carries the child's inbox
depth and how many ``Run`` it has taken: the proxy's depth is that depth plus the ``Run``
sent and not yet taken, so it never undercounts, and the inbox's capacity is enforced
here, where ``offer`` is called.

What the control plane needs of a model it gets without the worker: the tokenizer and
chat template come from the backend's vocabulary-only load (``load_tokenizer``) in the
server's process, as in thread mode.

Limits. ``Call`` (a closure) does not cross a process: ``call`` fails its Future, and every
admin path uses ``ask`` (``AdminCall``), whose arguments must pickle. ``trace`` (the inbox
log tests replay) and ``stack`` (a stalled thread's stack) are thread mode's only. The
clock is ``time.monotonic`` on both sides. A backend crosses to the child by pickle (the
shipped ones hold nothing a load needs before it), and ``FaultInjector`` as
``FaultInjector.shared``. Backends import their runtimes (llama.cpp, ONNX Runtime) in
each worker process, not in the fork server, so no runtime's threads are forked.

Death. The child's end shows as the pipe's end: the reader thread reaps the process and
sets ``fault`` (its exit code or signal, or the ``WorkerFault`` its thread sent before it
exited), then wakes the supervisor, which ends the requests the worker held (500
``worker_failed``) and starts a replacement process that loads the dead one's models. A
stalled child (an overdue heartbeat) is killed when the supervisor abandons it.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.context
import signal
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

from sluice.backends.base import Backend, ModelSpec
from sluice.backends.faults import FaultInjector
from sluice.engine.messages import (
    AdminCall,
    Cancel,
    Inbound,
    Load,
    Reply,
    Retarget,
    Run,
    Unload,
    UnloadIdle,
)
from sluice.engine.request import Request
from sluice.engine.work_item import WorkItem
from sluice.engine.worker import Worker
from sluice.engine.worker.base import Outbox
from sluice.engine.worker.calls import Calls, failed, settle
from sluice.engine.worker.child import THREAD_DIED_EXIT, serve
from sluice.engine.worker.types import Heartbeat, WorkerFault, WorkerState
from sluice.policy.types import WorkerView
from sluice.policy.worker_config import WorkerConfig

log = logging.getLogger("sluice.worker")

CONTEXT = multiprocessing.get_context("forkserver")
"""Worker processes are forked by multiprocessing's fork server: a process started from a
fresh interpreter (never a fork of the threaded server, which would copy its locks in
whatever state they were) that has imported the worker's code once (``PRELOAD``), so a
replacement boots in tens of milliseconds, not the most of a second a fresh interpreter
and its imports take. The fork server starts with the first worker process."""
PRELOAD = ["sluice.engine.worker.child"]
CONTEXT.set_forkserver_preload(PRELOAD)


def exit_cause(exitcode: int | None) -> str:
    """How a worker process ended, for clients and metrics."""
    if exitcode is None:
        return "died (its process vanished)"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"died (its process was killed by {name})"
    return f"died (its process exited with code {exitcode})"


class ProcessWorker:
    """A worker in a child process, seen from the control plane (see the module
    docstring). Thread-safe as ``Worker`` is."""

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
        self.config = config
        self._clock = clock
        self._outbox = outbox
        self._on_death = on_death
        self._lock = threading.Lock()
        """Guards the counters and flags below (never held while the pipe is written)."""
        self._send_lock = threading.Lock()
        self._conn, child_conn = CONTEXT.Pipe(duplex=True)
        self._process = CONTEXT.Process(
            target=serve, args=(child_conn, config, dict(specs), dict(backends),
                                dict(faults or {})),
            name=f"sluice-worker-{config.worker_id}", daemon=True)
        self._child_conn = child_conn
        self._reader = threading.Thread(target=self._read, daemon=True,
                                        name=f"sluice-worker-{config.worker_id}-pipe")
        self._ready: Future[Any] = Future()
        """Done at the child's first message (its worker serves)."""
        self._calls = Calls()
        self._sent_runs = 0
        self._depth = 0
        self._taken = 0
        self._stopping = False
        self._ended = False
        """(lock) The pipe ended: the child is gone."""
        self._thread_fault: WorkerFault | None = None
        self.routed: dict[int, Request] = {}
        self.abandoned = False
        self.fault: WorkerFault | None = None
        self.heartbeat = Heartbeat(clock(), config.load_watchdog_s, "starting")
        self.state = WorkerState(worker_id=config.worker_id, budget_bytes=config.budget_bytes)
        self.trace: list[tuple[str, tuple[int, ...]]] | None = None

    @property
    def pid(self) -> int | None:
        """The worker process's id (``None`` before ``start``)."""
        return self._process.pid

    def start(self) -> None:
        self._process.start()
        self._child_conn.close()  # the child's end lives in the child now
        self._reader.start()

    # -- the pipe --------------------------------------------------------------------------

    def ready(self) -> Future[Any]:
        """Done once the worker process serves (its first message came); failed if it
        ended first. A process takes seconds to boot (a fresh interpreter, the imports)."""
        return self._ready

    def _send(self, message: tuple[Any, ...]) -> bool:
        """Send ``message`` to the child; False once it is gone. Takes only the pipe's own
        lock, never ``_lock``, so the reader thread is never held up by a send."""
        with self._send_lock:
            if self._ended:
                return False
            try:
                self._conn.send(message)
            except (OSError, ValueError):  # broken pipe: the reader thread sees the end too
                return False
            return True

    def _read(self) -> None:
        """The reader thread: the child's messages onto the outbox until the pipe ends."""
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                break
            if not self._ready.done():
                settle(self._ready, result=True)
            kind = message[0]
            if kind == "out":
                _, messages, depth, taken, beat = message
                with self._lock:
                    self._depth, self._taken = depth, taken
                self.heartbeat = beat
                self._outbox.put((self, messages))
            elif kind == "beat":
                self.heartbeat = message[1]
            elif kind == "fault":
                self._thread_fault = message[1]
        self._ended_now()

    def _ended_now(self) -> None:
        with self._lock, self._send_lock:
            self._ended = True
        settle(self._ready, exc=RuntimeError("the worker process ended"))
        self._process.join(5.0)
        self._conn.close()
        code = self._process.exitcode
        if self._stopping and not self.abandoned and code == 0:
            return  # stopped on purpose
        thread_fault = self._thread_fault
        if thread_fault is not None and code == THREAD_DIED_EXIT:
            self.fault = thread_fault
        else:
            self.fault = WorkerFault(exit_cause(code), f"worker process {self.pid} ended "
                                     f"(exit code {code})", self._clock())
        self._on_death()

    # -- the control plane's calls -----------------------------------------------------------

    def offer(self, req: Request) -> bool:
        """Hand ``req``'s work to the worker process (a ``Run`` down the pipe); False if its
        inbox is full or it stops."""
        with self._lock:
            if self._stopping or self._queue_depth() >= self.config.inbox_capacity:
                return False
            self._sent_runs += 1  # the place is taken before the send, so none oversells
            req.worker_id = self.config.worker_id
            self.routed[req.request_id] = req
        if self._send(("run", Run(WorkItem.of(req), self._clock()))):
            return True
        with self._lock:
            self._sent_runs -= 1
            self.routed.pop(req.request_id, None)
            req.worker_id = None
        return False

    def _queue_depth(self) -> int:
        """(lock) The child's last reported depth plus the ``Run`` it has not taken yet."""
        return self._depth + self._sent_runs - self._taken

    def wake(self) -> None:
        self._send(("wake",))

    def post(self, message: Inbound) -> bool:
        """Send ``message`` to the worker; False if it stops."""
        return not self._stopping and self._send(("post", message))

    def cancel(self, request_id: int) -> None:
        self.post(Cancel(request_id))

    def retarget(self, request_id: int, model_id: str) -> None:
        self.post(Retarget(request_id, model_id))

    def unload_idle(self, asked: tuple[str, ...], idle: tuple[str, ...]) -> None:
        self.post(UnloadIdle(asked, idle))

    def load(self, model_id: str) -> Future[Any]:
        return self._ask(lambda call_id: Load(call_id, model_id))

    def unload(self, model_id: str) -> Future[Any]:
        return self._ask(lambda call_id: Unload(call_id, model_id))

    def ask(self, method: str, *args: Any) -> Future[Any]:
        return self._ask(lambda call_id: AdminCall(call_id, method, args))

    def call(self, fn: Callable[[], Any]) -> Future[Any]:
        """Refused: a function does not cross to a worker process (use ``ask``)."""
        return failed(TypeError("a Call carries code, which does not cross to a worker "
                                "process: use ask (AdminCall)"))

    def _ask(self, make: Callable[[int], Inbound]) -> Future[Any]:
        with self._lock:
            stopping = self._stopping
        if stopping:
            return failed(RuntimeError("worker is stopping"))
        call_id, fut = self._calls.open()  # open before the send: the answer may come first
        if not self._send(("post", make(call_id))):
            self._calls.fail(call_id, RuntimeError("worker is stopping"))
        return fut

    def answer(self, reply: Reply) -> None:
        self._calls.answer(reply)

    def stop(self) -> None:
        """Have the worker cancel what is left and its process exit."""
        with self._lock:
            self._stopping = True
        self._send(("stop",))

    def join(self, timeout_s: float | None = None) -> None:
        """Wait for the process to exit and the reader to put its last messages out."""
        self._process.join(timeout_s)
        self._reader.join(timeout_s)

    def is_alive(self) -> bool:
        """The worker process runs and its pipe is open."""
        with self._lock:
            ended = self._ended
        return not ended and self._process.is_alive()

    @property
    def stopped_on_purpose(self) -> bool:
        return self._stopping and not self.abandoned

    def holds_work(self) -> bool:
        with self._lock:
            depth = self._queue_depth()
        return depth > 0 or self.state.active_count > 0

    def abandon(self, reason: str) -> None:
        """Give up on this worker: no more work, its pending calls fail with ``reason``,
        and its process is killed if it still runs (a stalled one)."""
        with self._lock:
            self.abandoned = True
            self._stopping = True
        self._calls.fail_all(RuntimeError(reason))
        if self._process.is_alive():
            self._process.kill()

    def close_models(self) -> None:
        """Nothing to do: a worker process's models ended with it."""

    def stack(self) -> str:
        return (f"(worker process {self.pid}: its stack is not visible from the server's "
                "process; a fatal signal's stack is on its stderr)")

    def view(self) -> WorkerView:
        state = self.state
        with self._lock:
            depth = self._queue_depth()
            stopping = self._stopping or self._ended
        return WorkerView(
            worker_id=self.config.worker_id,
            queue_depth=depth,
            active_count=state.active_count,
            inbox_free=0 if stopping else max(0, self.config.inbox_capacity - depth),
            budget_bytes=self.config.budget_bytes,
            free_bytes=self.config.budget_bytes - state.resident_bytes,
            resident=state.resident,
            evictable_bytes=state.evictable_bytes,
        )

    def inbox_depth(self) -> int:
        with self._lock:
            return self._queue_depth()


AnyWorker = Worker | ProcessWorker
"""A worker of either isolation, as the runtime, its pump and the supervisor hold it."""
