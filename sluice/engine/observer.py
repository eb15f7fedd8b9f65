"""What the runtime reports as it works. The server implements it with Prometheus and with
the status page's decision log (``Observers`` joins them); the default does nothing. Called
from control-plane threads (the pump applies what the workers report, the dispatcher and
the supervisor what they decide): implementations must be thread-safe and cheap (the pump
applies tokens between them)."""

from __future__ import annotations

from collections.abc import Callable

from sluice.engine.request import Request


class Observer:
    """No-op base; override what you record."""

    def admitted(self, req: Request) -> None:
        """A request entered the queue."""

    def rejected(self, model_id: str, tenant_id: str, reason: str) -> None:
        """A request was refused at admission."""

    def finished(self, req: Request) -> None:
        """A request reached its terminal state (exactly once per request)."""

    def token_gap(self, model_id: str, seconds: float) -> None:
        """A sequence produced a token ``seconds`` after its previous one (inter-token
        latency; called once per generated token after the first)."""

    def batch(self, worker_id: int, model_id: str, size: int) -> None:
        """A one-shot batch or a decode step ran with ``size`` members."""

    def batch_done(self, worker_id: int, model_id: str, size: int, seconds: float) -> None:
        """A one-shot batch of ``size`` completed in ``seconds``."""

    def planned(self, group_id: str, variant: str | None, reason: str) -> None:
        """The variant planner chose ``variant`` for a request of ``group_id`` (``None``:
        rejected, ``reason`` ``deadline_infeasible``)."""

    def model_loaded(self, worker_id: int, model_id: str, seconds: float) -> None:
        """A worker loaded a model."""

    def model_evicted(self, worker_id: int, model_id: str) -> None:
        """A worker evicted (unloaded) a model to make room, or on request."""

    def model_idle_unloaded(self, worker_id: int, model_id: str) -> None:
        """A worker unloaded a model whose keep-alive ran out."""

    def model_load_failed(self, worker_id: int, model_id: str, error: str) -> None:
        """A load raised."""

    def worker_died(self, worker_id: int, cause: str, failed_requests: int) -> None:
        """The supervisor declared a worker dead (``cause``: ``died`` or ``stalled``) and
        ended the ``failed_requests`` it held."""

    def worker_recovered(self, worker_id: int, seconds: float) -> None:
        """A dead worker's replacement loaded its models ``seconds`` after the death."""


class Observers(Observer):
    """Several observers as one: each call reaches, in the order given, the observers that
    override it (so a method none of them records costs one empty loop, not a call each)."""

    def __init__(self, *observers: Observer) -> None:
        self.members = observers

        def overriding(name: str) -> list[Callable[..., None]]:
            return [getattr(o, name) for o in observers
                    if getattr(type(o), name) is not getattr(Observer, name)]

        self._admitted = overriding("admitted")
        self._rejected = overriding("rejected")
        self._finished = overriding("finished")
        self._token_gap = overriding("token_gap")
        self._batch = overriding("batch")
        self._batch_done = overriding("batch_done")
        self._planned = overriding("planned")
        self._model_loaded = overriding("model_loaded")
        self._model_evicted = overriding("model_evicted")
        self._model_idle_unloaded = overriding("model_idle_unloaded")
        self._model_load_failed = overriding("model_load_failed")
        self._worker_died = overriding("worker_died")
        self._worker_recovered = overriding("worker_recovered")

    def admitted(self, req: Request) -> None:
        for f in self._admitted:
            f(req)

    def rejected(self, model_id: str, tenant_id: str, reason: str) -> None:
        for f in self._rejected:
            f(model_id, tenant_id, reason)

    def finished(self, req: Request) -> None:
        for f in self._finished:
            f(req)

    def token_gap(self, model_id: str, seconds: float) -> None:
        for f in self._token_gap:
            f(model_id, seconds)

    def batch(self, worker_id: int, model_id: str, size: int) -> None:
        for f in self._batch:
            f(worker_id, model_id, size)

    def batch_done(self, worker_id: int, model_id: str, size: int, seconds: float) -> None:
        for f in self._batch_done:
            f(worker_id, model_id, size, seconds)

    def planned(self, group_id: str, variant: str | None, reason: str) -> None:
        for f in self._planned:
            f(group_id, variant, reason)

    def model_loaded(self, worker_id: int, model_id: str, seconds: float) -> None:
        for f in self._model_loaded:
            f(worker_id, model_id, seconds)

    def model_evicted(self, worker_id: int, model_id: str) -> None:
        for f in self._model_evicted:
            f(worker_id, model_id)

    def model_idle_unloaded(self, worker_id: int, model_id: str) -> None:
        for f in self._model_idle_unloaded:
            f(worker_id, model_id)

    def model_load_failed(self, worker_id: int, model_id: str, error: str) -> None:
        for f in self._model_load_failed:
            f(worker_id, model_id, error)

    def worker_died(self, worker_id: int, cause: str, failed_requests: int) -> None:
        for f in self._worker_died:
            f(worker_id, cause, failed_requests)

    def worker_recovered(self, worker_id: int, seconds: float) -> None:
        for f in self._worker_recovered:
            f(worker_id, seconds)
