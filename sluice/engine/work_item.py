"""``WorkItem``: a request as the worker that runs it holds it.

The control plane keeps the client's ``Request`` (its listeners, its decision record, the
state the API reads); at routing it hands the worker a ``WorkItem``, a copy of what running
the request needs (``WorkItem.of``), in a ``Run`` message. From then on the item belongs to
the worker's thread alone: the engines and the one-shot executor move it through its
states as they would a ``Request`` (it is one, without listeners of its own), and each
transition goes back as a message (``Started``, ``Token``, ``Progress``, ``Done``) that
the runtime's pump applies to the client's request. A cancel, a move to another variant
or a shutdown reaches the item only as a message to the worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sluice.engine.messages import Done, Progress, Send, Started, Token
from sluice.engine.request import Event, Final, PromptProgress, Request, RequestStatus


def _copied(req: Request) -> dict[str, Any]:
    """The fields of ``req`` that running it needs."""
    return {name: getattr(req, name) for name in _COPIED}


_COPIED = ("request_id", "model_id", "kind", "arrival_s", "prompt_tokens", "input", "params",
           "tenant_id", "priority", "deadline_s", "ttft_deadline_s", "ttft_target_s",
           "keep_alive", "report_progress", "worker_id")


def _rebuild(fields: dict[str, Any], queued_s: float | None) -> WorkItem:
    item = WorkItem(**fields, status=RequestStatus.QUEUED)
    item.times.queued_s = queued_s
    return item


def _unbound(_: object) -> None:
    raise RuntimeError("a WorkItem sends nothing until a worker binds it")


@dataclass(eq=False)
class WorkItem(Request):
    """A worker's own copy of a request (see the module docstring). Not thread-safe: only
    the thread of the worker it was given to touches it."""

    _send: Send = field(default=_unbound, repr=False)
    _sent_cached: int = field(default=0, repr=False)

    @classmethod
    def of(cls, req: Request) -> WorkItem:
        """What running ``req`` needs, as a new item (queued since ``req`` was)."""
        return _rebuild(_copied(req), req.times.queued_s)

    def __reduce__(self) -> tuple[Any, ...]:
        """An item pickles (to a worker process) as the fields ``of`` copies, unbound: the
        process's worker binds it (``Worker.accept``). Only a fresh item crosses."""
        return (_rebuild, (_copied(self), self.times.queued_s))

    def bind(self, send: Send) -> None:
        """Send this item's transitions with ``send`` (the worker that owns it)."""
        self._send = send
        self.listeners = [self._forward]

    def mark_running(self, now: float) -> bool:
        started = super().mark_running(now)
        if started:
            self._send(Started(self.request_id, now))
        return started

    def _forward(self, event: Event) -> None:
        if isinstance(event, Final):
            self._send(Done(self.request_id, event, self.times.finished_s or 0.0,
                            self.cached_prompt_tokens, self.batch_size))
            return
        cached = None
        if self.cached_prompt_tokens != self._sent_cached:
            cached = self._sent_cached = self.cached_prompt_tokens
        if isinstance(event, PromptProgress):
            self._send(Progress(self.request_id, event, cached))
        else:
            self._send(Token(self.request_id, event, cached))
