"""The control plane's side of a worker (any thread): put messages in its mailbox —
``offer`` (a ``Run`` into the bounded inbox), ``cancel``, ``retarget``, ``load``,
``unload``, ``ask`` (an ``AdminCall``), ``call`` — and read back what it published
(``state``, ``heartbeat``, ``view``). ``stop``, ``abandon`` and ``close_models`` end it."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from sluice.engine.messages import (
    AdminCall,
    Call,
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
from sluice.engine.worker.base import WorkerBase
from sluice.engine.worker.calls import failed
from sluice.policy.types import WorkerView


class Control(WorkerBase):
    """Methods the control plane calls; none touches what the worker's thread owns."""

    def start(self) -> None:
        self._thread.start()

    def offer(self, req: Request) -> bool:
        """Hand ``req``'s work to this worker (a ``WorkItem`` in its inbox); False if the
        inbox is full or the worker stops."""
        with self._cv:
            if self._stopping or self._queue_depth() >= self.config.inbox_capacity:
                return False
            req.worker_id = self.config.worker_id
            item = WorkItem.of(req)
            item.bind(self._send_item)
            self.routed[req.request_id] = req
            self._inbox.append(Run(item, self._clock()))
            self._trace("offer", req)
            self._dirty = True
            self._cv.notify()
            return True

    def ready(self) -> Future[Any]:
        """Done once the worker serves: a thread worker at once (its thread starts with
        ``start``); the interface ``process.ProcessWorker`` shares, whose process first
        has to boot."""
        fut: Future[Any] = Future()
        fut.set_result(True)
        return fut

    def accept(self, run: Run) -> None:
        """Put ``run`` in the inbox as sent: a worker process's side of ``offer``, whose
        proxy in the control plane checked the inbox's room and keeps the ``Request``."""
        run.item.bind(self._send_item)
        with self._cv:
            self._inbox.append(run)
            self._trace("offer", run.item)
            self._dirty = True
            self._cv.notify()

    def wake(self) -> None:
        """Look at the inbox again soon (a clock moved, in tests)."""
        with self._cv:
            self._dirty = True
            self._cv.notify()

    def post(self, message: Inbound) -> bool:
        """Put ``message`` in the control queue; False if the worker stops."""
        with self._cv:
            if self._stopping:
                return False
            self._controls.append(message)
            self._dirty = True
            self._cv.notify()
            return True

    def cancel(self, request_id: int) -> None:
        """Stop request ``request_id`` at the worker's next check (``Cancel``)."""
        self.post(Cancel(request_id))

    def retarget(self, request_id: int, model_id: str) -> None:
        """Move request ``request_id`` to ``model_id`` if it still waits in the inbox when
        the worker looks, between batches (``Retarget``; answered with ``Moved``). The
        worker reads a waiting item's model only on its thread, so a move cannot split a
        batch it is forming."""
        self.post(Retarget(request_id, model_id))

    def unload_idle(self, asked: tuple[str, ...], idle: tuple[str, ...]) -> None:
        """Answer the worker's ``IdleModels`` (``UnloadIdle``)."""
        self.post(UnloadIdle(asked, idle))

    def load(self, model_id: str) -> Future[Any]:
        """Make ``model_id`` resident (``Load``): True once resident, False while the
        victims it needs evicted are in use; fails if it cannot load."""
        return self._ask(lambda call_id: Load(call_id, model_id))

    def unload(self, model_id: str) -> Future[Any]:
        """Unload ``model_id`` if resident and idle (``Unload``): False if not resident;
        fails while it is in use."""
        return self._ask(lambda call_id: Unload(call_id, model_id))

    def ask(self, method: str, *args: Any) -> Future[Any]:
        """Run the admin method ``method`` (``messages.ADMIN_METHODS``) with ``args`` on the
        worker thread between steps (``AdminCall``); its result comes back in a Future."""
        return self._ask(lambda call_id: AdminCall(call_id, method, args))

    def call(self, fn: Callable[[], Any]) -> Future[Any]:
        """Run ``fn()`` on the worker thread between steps (``Call``; admin and tests);
        its result comes back in a Future."""
        return self._ask(lambda call_id: Call(call_id, fn))

    def _ask(self, make: Callable[[int], Inbound]) -> Future[Any]:
        with self._cv:
            if self._stopping:
                return failed(RuntimeError("worker is stopping"))
            call_id, fut = self._calls.open()
            self._controls.append(make(call_id))
            self._dirty = True
            self._cv.notify()
        return fut

    def answer(self, reply: Reply) -> None:
        """Resolve the Future of ``reply``'s call (the pump, on a ``Reply``)."""
        self._calls.answer(reply)

    def stop(self) -> None:
        """Cancel what is left and end the thread (the runtime drains first)."""
        with self._cv:
            self._stopping = True
            self._cv.notify()

    def join(self, timeout_s: float | None = None) -> None:
        self._thread.join(timeout_s)

    def is_alive(self) -> bool:
        """The worker's thread is running."""
        return self._thread.is_alive()

    @property
    def stopped_on_purpose(self) -> bool:
        """``stop`` was called (not a death, not an abandonment)."""
        return self._stopping and not self.abandoned

    def holds_work(self) -> bool:
        """Requests are waiting in its inbox or engines, or running on it."""
        with self._cv:
            depth = self._queue_depth()
        return depth > 0 or self.state.active_count > 0

    def abandon(self, reason: str) -> None:
        """Give up on this worker (the supervisor replaces it): it takes no more work, its
        pending admin calls fail with ``reason``, and its thread ends (closing its models)
        if it ever resumes. Its requests are the supervisor's to end."""
        with self._cv:
            self.abandoned = True
            self._stopping = True
            self._cv.notify()
        self._calls.fail_all(RuntimeError(reason))

    def close_models(self) -> None:
        """Release the models of a worker whose thread is dead (no one else uses them)."""
        if self._thread.is_alive():
            raise RuntimeError(f"worker {self.config.worker_id}: its thread still runs")
        for model_id in list(self._models):
            self._models.pop(model_id).close()
        self._engines.clear()

    def stack(self) -> str:
        """Where the thread is now (for the log of a stalled worker)."""
        frame = sys._current_frames().get(self._thread.ident or -1)
        return "".join(traceback.format_stack(frame)) if frame is not None else ""

    def view(self) -> WorkerView:
        """What the router needs, consistent with the inbox at this instant."""
        state = self.state
        with self._cv:
            depth = self._queue_depth()
        return WorkerView(
            worker_id=self.config.worker_id,
            queue_depth=depth,
            active_count=state.active_count,
            inbox_free=0 if self._stopping else max(0, self.config.inbox_capacity - depth),
            budget_bytes=self.config.budget_bytes,
            free_bytes=self.config.budget_bytes - state.resident_bytes,
            resident=state.resident,
            evictable_bytes=state.evictable_bytes,
        )

    def inbox_depth(self) -> int:
        with self._cv:
            return self._queue_depth()

