"""The control plane's registry of a worker's calls awaiting an answer (``Load``,
``Unload``, ``AdminCall``, ``Call``): one per worker, in thread and process mode alike."""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import Future, InvalidStateError
from typing import Any

from sluice.engine.messages import Reply


class Calls:
    """Call ids and the Futures their answers resolve.

    Invariant: every Future ``open`` hands out is settled exactly once — by ``answer``
    with its call's ``Reply``, by ``fail`` (its message could not be sent), or by
    ``fail_all`` (the worker was given up) — and whichever comes first wins; a later
    answer to the same id is ignored. Once ``fail_all`` has run the registry is closed:
    ``open`` hands out ids whose Futures are already failed, so no call opened after the
    worker was given up waits forever. Thread-safe (its own lock, never held while a
    Future is settled, so no callback runs under it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[int, Future[Any]] = {}
        self._ids = itertools.count(1).__next__
        self._closed: BaseException | None = None

    def open(self) -> tuple[int, Future[Any]]:
        """A fresh call id and the Future its answer will resolve (already failed if the
        registry is closed)."""
        fut: Future[Any] = Future()
        with self._lock:
            call_id = self._ids()
            closed = self._closed
            if closed is None:
                self._pending[call_id] = fut
        if closed is not None:
            settle(fut, exc=closed)
        return call_id, fut

    def answer(self, reply: Reply) -> None:
        """Resolve the Future of ``reply``'s call with its result or error (the pump, on a
        ``Reply``); nothing if that call was already settled."""
        self._settle(reply.call_id, result=reply.result, exc=reply.error)

    def fail(self, call_id: int, exc: BaseException) -> None:
        """Fail call ``call_id`` with ``exc`` if it is still pending."""
        self._settle(call_id, exc=exc)

    def _settle(self, call_id: int, *, result: Any = None,
                exc: BaseException | None = None) -> None:
        with self._lock:
            fut = self._pending.pop(call_id, None)
        if fut is not None:
            settle(fut, result=result, exc=exc)

    def fail_all(self, exc: BaseException) -> None:
        """Fail every pending call with ``exc`` and close the registry."""
        with self._lock:
            self._closed = exc
            pending = list(self._pending.values())
            self._pending.clear()
        for fut in pending:
            settle(fut, exc=exc)

    def pending_count(self) -> int:
        """Calls opened and not yet settled."""
        with self._lock:
            return len(self._pending)


def failed(exc: BaseException) -> Future[Any]:
    """A Future already failed with ``exc``: the answer to a call refused before it is
    opened (a stopping worker, a ``Call`` that cannot cross to a process)."""
    fut: Future[Any] = Future()
    fut.set_exception(exc)
    return fut


def settle(fut: Future[Any], *, result: Any = None, exc: BaseException | None = None) -> None:
    """Resolve ``fut`` unless it already is (a Future two paths may end, such as a worker
    process's ``ready``: its first message, or the end of its pipe)."""
    try:
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result)
    except InvalidStateError:
        pass
