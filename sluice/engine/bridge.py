"""The asyncio bridge: a request's events, applied on the runtime's pump thread (or the
thread that ended the request), delivered to an event loop as an async stream.

Those threads call a request's listeners; ``AsyncHandle`` is one such listener that
posts each event through its loop's ``_Mailbox`` (one per loop, shared by every handle
on it), and the loop side reads them from an ``asyncio.Queue``. Nothing here blocks the
posting thread: posting takes one short lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import AsyncIterator
from typing import Protocol

from sluice.engine.request import Event, Final, Request, TokenEvent


class Canceller(Protocol):
    """What a handle needs of the runtime: to cancel its request (``Runtime.cancel``)."""

    def cancel(self, request_id: int) -> bool: ...


class _Mailbox:
    """Hands events from the runtime's threads to one event loop, waking it once per burst.

    A decode step emits one token for every running sequence; posting each with its own
    ``call_soon_threadsafe`` wakes the loop once per token, and on a 2-core machine every
    wake-up preempts one of llama.cpp's compute threads mid-step (measured: the decode step
    at batch 8 took twice as long in the server as alone). Here the first post of a burst
    schedules one drain; the rest ride along.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._items: list[tuple[asyncio.Queue[Event], Event]] = []

    def post(self, queue: asyncio.Queue[Event], event: Event) -> None:
        with self._lock:
            self._items.append((queue, event))
            if len(self._items) > 1:
                return  # a drain is already scheduled
        # A closed loop raises RuntimeError: nobody is listening any more.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            items, self._items = self._items, []
        for queue, event in items:
            queue.put_nowait(event)


_mailboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Mailbox] = (
    weakref.WeakKeyDictionary()
)
_mailboxes_lock = threading.Lock()


def _mailbox(loop: asyncio.AbstractEventLoop) -> _Mailbox:
    with _mailboxes_lock:
        box = _mailboxes.get(loop)
        if box is None:
            box = _mailboxes[loop] = _Mailbox(loop)
        return box


class AsyncHandle:
    """An asyncio view of one request's events (tokens, then one ``Final``)."""

    def __init__(self, runtime: Canceller, req: Request, loop: asyncio.AbstractEventLoop) -> None:
        self.request = req
        self._runtime = runtime
        self._mailbox = _mailbox(loop)
        self._queue: asyncio.Queue[Event] = asyncio.Queue()
        self.final: Final | None = None
        req.listeners.append(self._push)

    def _push(self, event: Event) -> None:
        self._mailbox.post(self._queue, event)

    async def events(self) -> AsyncIterator[Event]:
        """Every event in order, ending with the ``Final``."""
        while self.final is None:
            event = await self._queue.get()
            if isinstance(event, Final):
                self.final = event
            yield event

    async def tokens(self) -> AsyncIterator[str]:
        """The generated text, piece by piece."""
        async for event in self.events():
            if isinstance(event, TokenEvent) and event.text:
                yield event.text

    async def result(self) -> Final:
        """Wait for the terminal event."""
        async for _ in self.events():
            pass
        assert self.final is not None
        return self.final

    def cancel(self) -> bool:
        return self._runtime.cancel(self.request.request_id)
