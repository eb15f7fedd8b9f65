"""What crosses between the control plane and a worker: plain, frozen messages.

Inbound (control plane → worker, through the worker's mailbox): ``Run`` hands the worker
a ``WorkItem`` it owns from then on; ``Cancel``, ``Retarget``, ``Load``, ``Unload`` and
``UnloadIdle`` name requests and models by id. ``AdminCall`` runs one of the worker's
admin methods by name (``ADMIN_METHODS``: a slot's erasure, a function on a model's
engine, the KV integrity check) between steps. ``Call`` runs an arbitrary function on the
worker's thread between steps; it is the one message that holds code (tests), so it exists
only in thread mode: a worker process refuses it (a closure does not cross a process), and
every admin path uses ``AdminCall``.

Every message but ``Call`` pickles when its payload does (a ``WorkItem`` pickles as the
fields it copies), which is what lets a worker run in a process of its own
(``workers.isolation = "process"``, ``sluice.engine.worker.process``).

Outbound (worker → control plane, onto the runtime's outbox, in the order sent): a
request's ``Started``, ``Token``, ``Progress`` and ``Done``; a step's or batch's ``Batch`` and
``BatchDone``; ``Moved`` (the answer to ``Retarget``); ``ModelEvent``; ``IdleModels``
(asks which idle models no live request needs); ``Room`` (the inbox has room again);
``Reply`` (the answer to ``Load``, ``Unload`` or ``Call``); ``State`` (the worker's
snapshot); and ``Fence``, which only the control side puts there. The runtime's pump
(``sluice.engine.runtime.pump``) is the only reader: it turns them into request state,
listeners, metrics and planner observations, so no lock of the runtime is ever taken on a
worker's thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from sluice.engine.request import Final, PromptProgress, TokenEvent

if TYPE_CHECKING:
    from sluice.engine.work_item import WorkItem
    from sluice.engine.worker.types import WorkerState

# -- inbound ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Run:
    """Run ``item``: the worker owns it from now on (the control plane keeps its
    ``Request`` and hears of the item only through outbound messages). Sent into the
    worker's bounded inbox at ``sent_s``, when its wait for batch company begins."""

    item: WorkItem
    sent_s: float


@dataclass(frozen=True, slots=True)
class Cancel:
    """Stop request ``request_id`` at its next check (no-op if the worker has ended it)."""

    request_id: int


@dataclass(frozen=True, slots=True)
class Retarget:
    """Move request ``request_id`` to ``model_id`` if it still waits in the inbox; answered
    with ``Moved``."""

    request_id: int
    model_id: str


@dataclass(frozen=True, slots=True)
class Load:
    """Make ``model_id`` resident; answered with ``Reply`` (``True``: resident,
    ``False``: its victims are in use)."""

    call_id: int
    model_id: str


@dataclass(frozen=True, slots=True)
class Unload:
    """Unload ``model_id`` if resident and idle; answered with ``Reply`` (``False``: not
    resident; an error while it is in use)."""

    call_id: int
    model_id: str


@dataclass(frozen=True, slots=True)
class UnloadIdle:
    """The answer to ``IdleModels(asked)``: of those, ``idle`` have no live request in the
    runtime; the worker unloads each that is still past its keep-alive and unused."""

    asked: tuple[str, ...]
    idle: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Call:
    """Run ``fn()`` on the worker's thread between steps; answered with ``Reply``."""

    call_id: int
    fn: Callable[[], Any]


ADMIN_METHODS = frozenset({"erase_slot_now", "on_engine", "integrity"})
"""The worker methods an ``AdminCall`` may name (``sluice.engine.worker.models``)."""


@dataclass(frozen=True, slots=True)
class AdminCall:
    """Run the worker's admin method ``method`` (one of ``ADMIN_METHODS``) with ``args``
    on its thread between steps; answered with ``Reply``. It crosses to a worker process
    when ``args`` pickle (``on_engine``'s function: a module-level one or a
    ``functools.partial`` of one)."""

    call_id: int
    method: str
    args: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        if self.method not in ADMIN_METHODS:
            raise ValueError(f"AdminCall: {self.method!r} is not one of {sorted(ADMIN_METHODS)}")


Inbound = Cancel | Retarget | Load | Unload | UnloadIdle | Call | AdminCall
"""What goes through a worker's control queue (``Run`` goes through its bounded inbox)."""

# -- outbound --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Started:
    """Request ``request_id`` began running at ``time_s``."""

    request_id: int
    time_s: float


@dataclass(frozen=True, slots=True)
class Token:
    """One of the request's events; ``cached_prompt_tokens`` is set when the engine
    reused prompt KV for it since the last message (``None``: unchanged)."""

    request_id: int
    event: TokenEvent
    cached_prompt_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Progress:
    """How far the engine has computed the prompt of a request that asked
    (``PromptProgress``); ``cached_prompt_tokens`` as in ``Token``."""

    request_id: int
    progress: PromptProgress
    cached_prompt_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Done:
    """Request ``request_id`` ended at ``time_s`` with ``final`` (its one terminal event
    from this worker)."""

    request_id: int
    final: Final
    time_s: float
    cached_prompt_tokens: int = 0
    batch_size: int | None = None
    """One-shot: the size of the batch it ran in."""


@dataclass(frozen=True, slots=True)
class Batch:
    """A one-shot batch or a decode step of ``model_id`` began with ``size`` members (the
    members' ``Started`` come first)."""

    model_id: str
    size: int


@dataclass(frozen=True, slots=True)
class BatchDone:
    """A one-shot batch of ``size`` completed in ``seconds``."""

    model_id: str
    size: int
    seconds: float


@dataclass(frozen=True, slots=True)
class Moved:
    """The answer to ``Retarget``: ``applied`` when the request (still in the inbox) now
    runs on ``model_id``."""

    request_id: int
    model_id: str
    applied: bool


@dataclass(frozen=True, slots=True)
class ModelEvent:
    """A model was ``loaded`` (in ``seconds``), ``evicted`` (to make room or on request),
    ``idle_unloaded`` (its keep-alive ran out) or ``load_failed`` (``error``)."""

    model_id: str
    what: Literal["loaded", "evicted", "idle_unloaded", "load_failed"]
    seconds: float = 0.0
    error: str = ""


@dataclass(frozen=True, slots=True)
class IdleModels:
    """These models are past their keep-alive and unused here: which of them has no live
    request in the runtime? (answered with ``UnloadIdle``)."""

    model_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Room:
    """The inbox has room again (a request left it or an engine took one)."""


@dataclass(frozen=True, slots=True)
class Reply:
    """The answer to ``Load``, ``Unload``, ``Call`` or ``AdminCall`` ``call_id``: ``result``, or the
    exception it raised."""

    call_id: int
    result: Any = None
    error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class State:
    """The worker's snapshot after a loop."""

    state: WorkerState


@dataclass(frozen=True, slots=True)
class Fence:
    """Put on the outbox by the control side, never by a worker: the pump sets ``reached``
    once it has applied every message queued before it."""

    reached: threading.Event


Outbound = (Started | Token | Progress | Done | Batch | BatchDone | Moved | ModelEvent | IdleModels
            | Room | Reply | State | Fence)
Send = Callable[[Outbound], None]
"""Puts one outbound message on the runtime's outbox (the worker's sender bound in)."""
