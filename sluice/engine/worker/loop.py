"""A worker's thread: serve the control queue's messages, then the inbox in order (a
generative item at the head moves into its model's engine, a one-shot item at the head
starts a dynamic batch of the contiguous same-model items behind it), step every engine
with work, publish the state, and sleep until something arrives or a timer is due.

The thread stamps the heartbeat before every piece of work (a step, a batch, a load, an
idle wait) with how long that piece may take; ``sluice.engine.supervisor`` declares the
worker dead when its thread died (``fault`` says how) or a stamp is overdue while it holds
work."""

from __future__ import annotations

import traceback
from collections import deque

from sluice.backends.base import OneShotModel
from sluice.engine.messages import (
    AdminCall,
    Batch,
    Call,
    Cancel,
    Inbound,
    Load,
    Moved,
    Reply,
    Retarget,
    Room,
    Run,
    Unload,
    UnloadIdle,
)
from sluice.engine.request import RequestStatus, end_stopped, is_stopped
from sluice.engine.work_item import WorkItem
from sluice.engine.worker.models import Models
from sluice.engine.worker.types import IDLE_POLL_S, WorkerFault


class Loop(Models):
    """The worker thread's loop (``_run`` is its target) and its handling of inbound
    messages."""

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # a bug outside every barrier, or an injected kill
            self.fault = WorkerFault(f"died (its thread ended: {type(exc).__name__})",
                                     traceback.format_exc(), self._clock())
            self._flush()
            self._on_death()
            return
        self._shutdown()
        self._flush()

    def _serve(self) -> None:
        while True:
            stopping = self._handle_controls()
            if stopping:
                break
            did = self._loop_once()
            self._flush()
            if not did:
                self._sleep()

    def _handle_controls(self) -> bool:
        """Handle the control queue's messages and send their answers; True once the
        worker is to stop."""
        with self._cv:
            controls = list(self._controls)
            self._controls.clear()
            stopping = self._stopping
            self._dirty = False
        for message in controls:
            self._handle(message)
            self._flush()
        return stopping

    def _handle(self, message: Inbound) -> None:
        """Act on one inbound message (worker thread, between steps)."""
        if isinstance(message, Cancel):
            item = self._running.get(message.request_id) or self._waiting(message.request_id)
            if item is not None:
                item.cancel_requested = True
        elif isinstance(message, Retarget):
            item = self._waiting(message.request_id)
            applied = item is not None and not item.is_terminal
            if item is not None and applied:
                item.model_id = message.model_id
            self._send(Moved(message.request_id, message.model_id, applied))
        elif isinstance(message, UnloadIdle):
            self._unload_idle(message.asked, message.idle)
        else:
            self._beat("admin call", self.config.load_watchdog_s)
            try:
                if isinstance(message, Load):
                    result: object = self.load_now(message.model_id)
                elif isinstance(message, Unload):
                    result = self.unload_now(message.model_id)
                elif isinstance(message, AdminCall):
                    result = getattr(self, message.method)(*message.args)
                else:
                    assert isinstance(message, Call)
                    result = message.fn()
            except Exception as exc:
                self._send(Reply(message.call_id, error=exc))
            else:
                self._send(Reply(message.call_id, result))

    def _waiting(self, request_id: int) -> WorkItem | None:
        """The item ``request_id`` if it waits in the inbox."""
        with self._cv:
            return next((m.item for m in self._inbox if m.item.request_id == request_id), None)

    def _loop_once(self) -> bool:
        now = self._clock()
        self._beat("inbox", self.config.watchdog_s)
        self._sweep_inbox(now)
        did = self._advance_inbox(now)
        for engine in list(self._engines.values()):
            if engine.has_work:
                if engine.steps:
                    self._beat("step", self.config.watchdog_s)
                else:  # a fresh model's first pass also sets it up (measured: > 2 s)
                    self._beat("first step", self.config.load_watchdog_s)
                stepped = engine.step()
                if stepped:
                    self._send(Batch(engine.model.spec.model_id, engine.last_batch_size))
                self._flush()
                did = stepped or did
        did = self._unload_expired(self._clock()) or did
        self._publish()
        return did

    def _sleep(self) -> None:
        now = self._clock()
        wake = [now + IDLE_POLL_S]
        batch_wakeup_s = self._oneshot.next_wakeup_s()
        if batch_wakeup_s is not None:
            wake.append(batch_wakeup_s)
        expiry_s = self._residency.next_expiry_s(after_s=now)
        if expiry_s is not None:
            wake.append(expiry_s)
        for engine in self._engines.values():
            w = engine.next_wakeup_s(now)
            if w is not None:
                wake.append(w)
            wake.extend(t for t in (r.start_by_s for r in engine.waiting) if t is not None)
        with self._cv:
            wake.extend(t for t in (m.item.start_by_s for m in self._inbox) if t is not None)
            if not self._dirty and not self._stopping and not self._controls:
                wait_s = max(0.0, min(wake) - now)
                self._beat("idle", wait_s + self.config.watchdog_s)
                self._cv.wait(wait_s)

    def _sweep_inbox(self, now: float) -> None:
        """Cancelled and expired requests leave the inbox without running."""
        with self._cv:
            if not any(is_stopped(m.item, now) for m in self._inbox):
                return
            kept: deque[Run] = deque()
            gone: list[WorkItem] = []
            for message in self._inbox:
                if is_stopped(message.item, now):
                    gone.append(message.item)
                    self._trace("leave", message.item)
                else:
                    kept.append(message)
            self._inbox = kept
        for item in gone:
            end_stopped(item, now, "while queued at the worker")
        self._send(Room())

    def _advance_inbox(self, now: float) -> bool:
        """Serve the inbox head: generative → its engine; one-shot → a dynamic batch."""
        did = False
        self._oneshot.clear_wakeup()
        while True:
            with self._cv:
                if not self._inbox:
                    return did
                req, enqueued_s = self._inbox[0].item, self._inbox[0].sent_s
            spec = self._specs[req.model_id]
            readiness = self._ensure_resident(spec, now)
            if readiness == "wait":
                return did
            if readiness == "failed":
                did = True
                continue
            if spec.kind == "generative":
                with self._cv:
                    self._inbox.popleft()
                    self._engine_waiting += 1
                    self._trace("engine", req)
                self._residency.acquire(spec.model_id, now)
                self._keep_alive_after(spec, req)
                self._running[req.request_id] = req
                self._engines[spec.model_id].add(req)
                did = True
                continue
            with self._cv:
                model_ids = [m.item.model_id for m in self._inbox]
            take = self._oneshot.plan(model_ids, enqueued_s, now)
            if take == 0:
                return did
            with self._cv:
                batch = [self._inbox.popleft().item for _ in range(take)]
                self._trace("batch", *batch)
            self._send(Room())
            self._running.update((r.request_id, r) for r in batch)
            for member in batch:
                self._keep_alive_after(spec, member)
            model = self._models[spec.model_id]
            assert isinstance(model, OneShotModel)
            self._beat("batch", self.config.watchdog_s)
            self._oneshot.run(model, batch)
            return True

    def _batch_started(self, model_id: str, now: float) -> None:
        """A one-shot batch is about to run: pin its model, show its members as active."""
        self._residency.acquire(model_id, now)
        self._publish()
        self._flush()

    def _batch_ended(self, model_id: str) -> None:
        self._residency.release(model_id, self._clock())

    def _shutdown(self) -> None:
        now = self._clock()
        with self._cv:
            left = [m.item for m in self._inbox]
            for r in left:
                self._trace("leave", r)
            self._inbox.clear()
        for r in left:
            r.finish(RequestStatus.CANCELLED, now, error="server shutting down",
                     error_code="shutdown")
        for engine in self._engines.values():
            engine.abort_all(now, "server shutting down")
        self._engines.clear()
        for model_id in list(self._models):
            self._models.pop(model_id).close()
            if self._residency.is_resident(model_id):
                self._residency.evict(model_id)
        self._publish()
