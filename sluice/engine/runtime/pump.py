"""The pump: one control-plane thread that reads every worker's outbound messages
(``sluice.engine.messages``) from the runtime's outbox, in the order each worker sent them,
and applies them: a request's ``Started``, ``Token``, ``Progress`` and ``Done`` move the client's
``Request`` (so its listeners — the API's stream, the settlement — run here, not on a
decode thread); ``Batch`` and ``BatchDone`` reach the variant planner and the observer;
``ModelEvent`` the observer; ``Moved`` completes a move to another variant; ``IdleModels``
is answered from the live requests; ``Reply`` resolves an admin call's Future; ``State``
becomes the worker's published snapshot. A message from a replaced worker is applied
like any other: the requests it names have ended, so it changes nothing.

A worker puts its messages on the outbox in runs (a step's tokens, a loop's state: see
``Worker._flush``). The thread blocks on the outbox (no polling), so a token reaches its
listeners as soon as its step ends; it drains what else is waiting before it wakes the
dispatcher once.
"""

from __future__ import annotations

import logging
import queue
import threading

from sluice.engine.messages import (
    Batch,
    BatchDone,
    Done,
    Fence,
    IdleModels,
    ModelEvent,
    Moved,
    Outbound,
    Progress,
    Reply,
    Room,
    Started,
    State,
    Token,
)
from sluice.engine.runtime.settlement import Settlement
from sluice.engine.worker.process import AnyWorker

log = logging.getLogger("sluice.runtime")

FENCE_TIMEOUT_S = 5.0
"""How long ``_await_applied`` waits for the pump to reach its fence."""


class Pump(Settlement):
    """``_pump_loop`` is the pump thread's target; ``drain_outbox`` applies what is
    waiting on the caller's thread (tests that drive a runtime without its threads)."""

    def _pump_loop(self) -> None:
        try:
            while True:
                worker, messages = self._outbox.get()
                if worker is None:
                    return
                room = self._apply_all(worker, messages)
                stop = False
                while not stop:
                    try:
                        worker, messages = self._outbox.get_nowait()
                    except queue.Empty:
                        break
                    if worker is None:
                        stop = True
                    else:
                        room = self._apply_all(worker, messages) or room
                if room:
                    self._notify()
                if stop:
                    return
        except BaseException as exc:  # /health reports it from now on
            self.pump_fault = type(exc).__name__
            log.exception("the message pump failed; no worker's results are applied any more")

    def _stop_pump(self) -> None:
        """End the pump once it has applied everything already sent (workers stopped)."""
        self._outbox.put((None, ()))
        if self._pump.is_alive():
            self._pump.join(5.0)

    def _await_applied(self, worker: AnyWorker) -> bool:
        """Wait until the pump has applied every message on the outbox now (``worker``'s
        among them: a dead worker's last ``State`` before the supervisor reads it); False
        if the pump is not running or did not get there in ``FENCE_TIMEOUT_S``."""
        if not self._pump.is_alive():
            return False
        fence = Fence(threading.Event())
        self._outbox.put((worker, (fence,)))
        return fence.reached.wait(FENCE_TIMEOUT_S)

    def drain_outbox(self) -> None:
        """Apply every message waiting in the outbox, on this thread."""
        room = False
        while True:
            try:
                worker, messages = self._outbox.get_nowait()
            except queue.Empty:
                break
            if worker is not None:
                room = self._apply_all(worker, messages) or room
        if room:
            self._notify()

    def _apply_all(self, worker: AnyWorker, messages: tuple[Outbound, ...]) -> bool:
        room = False
        for message in messages:
            room = self._apply(worker, message) or room
        return room

    def _apply(self, worker: AnyWorker, message: Outbound) -> bool:
        """Apply one message; True if it may have made room for more work. A listener's
        exception is logged and ends only its own message's effect."""
        try:
            return self._dispatch_message(worker, message)
        except Exception:
            log.exception("applying %s from worker %d failed", type(message).__name__,
                          worker.config.worker_id)
            return True

    def _dispatch_message(self, worker: AnyWorker, message: Outbound) -> bool:
        worker_id = worker.config.worker_id
        if isinstance(message, Fence):
            message.reached.set()
            return False
        if isinstance(message, Token):
            req = worker.routed.get(message.request_id)
            if req is not None:
                if message.cached_prompt_tokens is not None:
                    req.cached_prompt_tokens = message.cached_prompt_tokens
                req.emit_token(message.event)
            return False
        if isinstance(message, Progress):
            req = worker.routed.get(message.request_id)
            if req is not None:
                if message.cached_prompt_tokens is not None:
                    req.cached_prompt_tokens = message.cached_prompt_tokens
                req.emit_progress(message.progress)
            return False
        if isinstance(message, Started):
            req = worker.routed.get(message.request_id)
            if req is not None:
                req.mark_running(message.time_s)
            return False
        if isinstance(message, Done):
            req = worker.routed.pop(message.request_id, None)
            if req is not None:
                req.cached_prompt_tokens = message.cached_prompt_tokens
                if message.batch_size is not None:
                    req.batch_size = message.batch_size
                req.end(message.final, message.time_s)
            return True
        if isinstance(message, State):
            worker.state = message.state
            return False
        if isinstance(message, Batch):
            self.variants.batch_started(worker_id, message.model_id, message.size)
            self.observer.batch(worker_id, message.model_id, message.size)
            return False
        if isinstance(message, BatchDone):
            self.variants.batch_done(message.model_id, message.size, message.seconds,
                                     worker_id)
            self.observer.batch_done(worker_id, message.model_id, message.size,
                                     message.seconds)
            return False
        if isinstance(message, Room):
            return True
        if isinstance(message, Moved):
            self._moved(worker, message)
            return False
        if isinstance(message, ModelEvent):
            self._model_event(worker_id, message)
            return True
        if isinstance(message, IdleModels):
            busy = self.busy_models()
            worker.unload_idle(message.model_ids,
                               tuple(m for m in message.model_ids if m not in busy))
            return False
        assert isinstance(message, Reply)
        worker.answer(message)
        return True

    def _moved(self, worker: AnyWorker, message: Moved) -> None:
        """The worker answered a ``Retarget``: the request runs on the new variant now (if
        the move was made), and it may be moved again."""
        req = worker.routed.get(message.request_id)
        if message.applied and req is not None and not req.is_terminal:
            self.variants.apply_move(req, message.model_id)
        with self._cv:
            self._moving.discard(message.request_id)

    def _model_event(self, worker_id: int, event: ModelEvent) -> None:
        if event.what == "loaded":
            self.observer.model_loaded(worker_id, event.model_id, event.seconds)
        elif event.what == "evicted":
            self.observer.model_evicted(worker_id, event.model_id)
        elif event.what == "idle_unloaded":
            self.observer.model_idle_unloaded(worker_id, event.model_id)
        else:
            self.observer.model_load_failed(worker_id, event.model_id, event.error)

    def busy_models(self) -> frozenset[str]:
        """Models with a live request (queued, routed or running): their keep-alive does not
        run out while it lives, so no admitted request waits on a model just unloaded."""
        with self._cv:
            return frozenset(r.model_id for r in self._live.values())
