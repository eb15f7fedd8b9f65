"""Admin operations run on a worker's thread: load and unload a model, erase a slot's
retained prefix, run a function on a model's engine between two steps."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from sluice.engine.continuous import ContinuousEngine
from sluice.engine.runtime.state import RuntimeState


class Admin(RuntimeState):
    """Calls that block on a worker's answer: make them off the event loop."""

    def call_on_workers(self, model_id: str, action: str) -> list[Any]:
        """Admin: ``load`` (on the least-loaded worker that can hold it) or ``unload``
        (everywhere). Returns the per-worker results."""
        if action == "load":
            spec = self.specs[model_id]
            views = [w.view() for w in self.workers]
            if any(model_id in v.resident for v in views):
                return [True]
            fits = [v for v in views if v.budget_bytes >= spec.memory_bytes]
            if not fits:
                raise RuntimeError(f"model {model_id} fits no worker's budget")
            target = min(fits, key=lambda v: (v.load, v.worker_id)).worker_id
            return [self.workers[target].load(model_id).result(timeout=600)]
        futures = [w.unload(model_id) for w in self.workers]
        return [f.result(timeout=60) for f in futures]

    def erase_slot(self, model_id: str, worker_id: int, slot: int) -> int | None:
        """Forget the retained prefix in slot ``slot`` of ``model_id`` on worker
        ``worker_id`` (``Worker.erase_slot_now``, on its thread): the tokens it held, or
        ``None`` while a request uses the slot. Blocks: call it off the event loop."""
        result: int | None = self.workers[worker_id].ask(
            "erase_slot_now", model_id, slot).result(timeout=60)
        return result

    def on_engine(self, model_id: str, worker_id: int,
                  fn: Callable[[ContinuousEngine], Any]) -> Future[Any]:
        """Run ``fn`` on ``model_id``'s engine on worker ``worker_id``, on that worker's
        thread between two steps (``Worker.on_engine``); the Future fails with
        ``ValueError`` if the model is not resident there then. With process isolation
        ``fn`` must pickle (a module-level function, or a ``functools.partial`` of one)."""
        return self.workers[worker_id].ask("on_engine", model_id, fn)
