"""What the runtime reports as it works. The server implements it with Prometheus; the
default does nothing. Called from worker and control threads: implementations must be
thread-safe and cheap (they run between decode steps)."""

from __future__ import annotations

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
