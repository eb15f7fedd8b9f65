"""A worker's models, on its thread: residency (load, evict, keep-alive expiry), the
admin operations that ``Load``, ``Unload`` and ``Call`` messages run, and the ``State``
snapshot it publishes after every loop."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from sluice.backends.base import GenerativeModel, ModelSpec
from sluice.engine.continuous import ContinuousEngine
from sluice.engine.messages import IdleModels, ModelEvent, Room, State
from sluice.engine.request import Request, RequestStatus
from sluice.engine.worker.base import WorkerBase
from sluice.engine.worker.types import (
    IDLE_POLL_S,
    ModelState,
    Readiness,
    WorkerState,
    spec_keep_alive,
)
from sluice.policy.capacity.keep_alive import effective_keep_alive


class Models(WorkerBase):
    """Residency and admin operations (worker thread only)."""

    def _keep_alive_after(self, spec: ModelSpec, req: Request) -> None:
        """The latest request's ``keep_alive`` holds for its model (Ollama's rule)."""
        self._residency.set_keep_alive(
            spec.model_id, effective_keep_alive(spec_keep_alive(spec), req.keep_alive))

    def _unload_expired(self, now: float) -> bool:
        """Ask the runtime about the idle models whose keep-alive ran out (``IdleModels``);
        a model with an item here (this inbox, its engine) stays, and so does one the
        runtime's answer says a live request needs."""
        if not self._residency.expired(now):
            return False
        ask = tuple(m for m in self._residency.expired(now, self._busy_here())
                    if now - self._idle_asked_s.get(m, float("-inf")) >= IDLE_POLL_S)
        if ask:
            self._idle_asked_s.update(dict.fromkeys(ask, now))
            self._send(IdleModels(ask))
        return False

    def _unload_idle(self, asked: tuple[str, ...], idle: tuple[str, ...]) -> None:
        """The runtime's answer to ``IdleModels``: unload those of ``idle`` still past
        their keep-alive and unused here."""
        for model_id in asked:
            if model_id not in idle:
                continue
            self._idle_asked_s.pop(model_id, None)
            if model_id in self._residency.expired(self._clock(), self._busy_here()):
                self._unload(model_id)
                self._send(ModelEvent(model_id, "idle_unloaded"))
        self._publish()

    def _busy_here(self) -> set[str]:
        """Models with an item in this inbox or an engine."""
        with self._cv:
            busy = {m.item.model_id for m in self._inbox}
        busy.update(m for m, e in self._engines.items() if e.has_work)
        return busy

    def _ensure_resident(self, spec: ModelSpec, now: float) -> Readiness:
        if self._residency.is_resident(spec.model_id):
            return "ready"
        if not self._residency.can_ever_hold(spec.memory_bytes):
            self._fail_model_requests(
                spec.model_id,
                f"model {spec.model_id} ({spec.memory_bytes} bytes) cannot fit worker "
                f"{self.config.worker_id}'s budget of {self.config.budget_bytes} bytes",
                "too_large",
            )
            return "failed"
        if not self._residency.fits_beside_pins(spec.model_id, spec.memory_bytes):
            self._fail_model_requests(
                spec.model_id,
                f"model {spec.model_id} ({spec.memory_bytes} bytes) cannot load on worker "
                f"{self.config.worker_id}: pinned models hold {self._residency.pinned_bytes} "
                f"of its {self.config.budget_bytes} bytes (unpin one with keep_alive >= 0, or "
                f"raise workers.budget_bytes)",
                "pinned_full",
            )
            return "failed"
        plan = self._residency.plan_load(spec.model_id, spec.memory_bytes)
        if plan is None:
            return "wait"  # victims are in use; they free up as their requests finish
        for victim in plan.victims:
            self._unload(victim)
        try:
            self._load(spec)
        except Exception as exc:
            self._failed[spec.model_id] = str(exc)
            self._send(ModelEvent(spec.model_id, "load_failed", error=str(exc)))
            self._fail_model_requests(
                spec.model_id, f"model {spec.model_id} failed to load: {exc}", "model_load_failed"
            )
            return "failed"
        return "ready"

    def _load(self, spec: ModelSpec) -> None:
        """Load ``spec`` now (worker thread only); the caller made room."""
        self._flush()
        t0 = self._clock()
        self._beat("load", self.config.load_watchdog_s)
        model = self._backends[spec.backend].load(spec)
        injector = self._faults.get(spec.model_id)
        if injector is not None:
            injector.arm(model)
        seconds = self._clock() - t0
        self._residency.commit_load(spec.model_id, spec.memory_bytes, spec.load_cost_s, t0,
                                    spec_keep_alive(spec))
        self._residency.check_integrity()
        self._models[spec.model_id] = model
        self._loaded_at_s[spec.model_id] = self._clock()
        self._failed.pop(spec.model_id, None)
        if spec.kind == "generative":
            assert isinstance(model, GenerativeModel)
            self._engines[spec.model_id] = ContinuousEngine(
                model, self.config.engine, self._clock, self._release
            )
        self._send(ModelEvent(spec.model_id, "loaded", seconds))
        self._publish()
        self._flush()  # its residency reaches the control side before its first step runs

    def _unload(self, model_id: str) -> None:
        self._residency.evict(model_id)
        self._loaded_at_s.pop(model_id, None)
        self._residency.check_integrity()
        self._engines.pop(model_id, None)
        self._models.pop(model_id).close()
        self._send(ModelEvent(model_id, "evicted"))

    def load_now(self, model_id: str) -> bool:
        """Admin: make ``model_id`` resident (worker thread; a ``Load``)."""
        readiness = self._ensure_resident(self._specs[model_id], self._clock())
        if readiness == "failed":
            raise RuntimeError(self._failed.get(model_id, "load failed"))
        return readiness == "ready"

    def on_engine(self, model_id: str, fn: Callable[[ContinuousEngine], Any]) -> Any:
        """Run ``fn`` on the model's engine (worker thread; via ``call``), between steps.
        ``ValueError`` if the model is not resident here."""
        engine = self._engines.get(model_id)
        if engine is None:
            raise ValueError(f"model {model_id} is not resident on worker "
                             f"{self.config.worker_id}")
        result = fn(engine)
        self._publish()
        return result

    def unload_now(self, model_id: str) -> bool:
        """Admin: unload ``model_id`` if resident and idle (worker thread; an ``Unload``)."""
        if not self._residency.is_resident(model_id):
            return False
        engine = self._engines.get(model_id)
        if engine is not None and engine.has_work:
            raise RuntimeError(f"model {model_id} is in use")
        self._unload(model_id)
        self._publish()
        return True

    def erase_slot_now(self, model_id: str, slot: int) -> int | None:
        """Forget the retained prefix in one of ``model_id``'s slots (worker thread; via
        ``call``): ``ContinuousEngine.erase_slot``. ``ValueError`` if the model is not
        resident here or has no such slot."""
        engine = self._engines.get(model_id)
        if engine is None:
            raise ValueError(f"model {model_id} is not resident on worker "
                             f"{self.config.worker_id}")
        erased = engine.erase_slot(slot)
        self._publish()
        return erased

    def integrity(self) -> dict[str, tuple[int, int]]:
        """Check the resident set and every KV allocator (worker thread; via ``call``):
        raises on a violation, returns ``{model: (free_blocks, total_blocks)}``."""
        self._residency.check_integrity()
        out = {}
        for model_id, engine in self._engines.items():
            engine.kv.check_integrity()
            if not engine.has_work and engine.kv.free_blocks != engine.kv.total_blocks:
                raise RuntimeError(f"{model_id}: idle engine holds KV blocks")
            out[model_id] = (engine.kv.free_blocks, engine.kv.total_blocks)
        return out

    def _release(self, req: Request) -> None:
        self._residency.release(req.model_id, self._clock())
        self._send(Room())

    def _fail_model_requests(self, model_id: str, message: str, code: str) -> None:
        with self._cv:
            mine = [m.item for m in self._inbox if m.item.model_id == model_id]
            for r in mine:
                self._trace("leave", r)
            self._inbox = deque(m for m in self._inbox if m.item.model_id != model_id)
        now = self._clock()
        for r in mine:
            r.finish(RequestStatus.FAILED, now, error=message, error_code=code)
        self._send(Room())

    def _publish(self) -> None:
        models = []
        for m in self._residency.models():
            engine = self._engines.get(m.model_id)
            models.append(
                ModelState(
                    model_id=m.model_id,
                    memory_bytes=m.memory_bytes,
                    in_use=m.in_use,
                    use_count=m.use_count,
                    kv_free_blocks=engine.kv.free_blocks if engine else None,
                    kv_total_blocks=engine.kv.total_blocks if engine else None,
                    running=engine.active_count if engine else 0,
                    waiting=len(engine.waiting) if engine else 0,
                    prefix_hit_tokens=engine.reused_prefix_tokens if engine else 0,
                    step_cost=engine.step_cost.current() if engine else None,
                    step_samples=engine.step_cost.samples_seen if engine else 0,
                    tpot_margin=engine.tpot_margin.state() if engine else None,
                    width=engine.width if engine else None,
                    step_times=engine.step_times.snapshot() if engine else {},
                    speculation=engine.speculation_state() if engine else None,
                    prompt_cache=(engine.prompt_cache.state()
                                  if engine and engine.prompt_cache else None),
                    loaded_at_s=self._loaded_at_s.get(m.model_id, m.last_used_s),
                    keep_alive=m.keep_alive.describe(),
                    keep_alive_idle_s=m.keep_alive.idle_s,
                    expires_at_s=m.expires_at_s,
                    slots=engine.slot_states() if engine else (),
                )
            )
        engines = self._engines.values()
        waiting = sum(len(e.waiting) for e in engines)
        with self._cv:
            freed = waiting < self._engine_waiting
            self._engine_waiting = waiting
        if freed:  # an engine took a waiting request: the inbox has room for the next one
            self._send(Room())
        self._send(State(WorkerState(
            worker_id=self.config.worker_id,
            budget_bytes=self.config.budget_bytes,
            resident_bytes=self._residency.resident_bytes,
            evictable_bytes=sum(m.memory_bytes for m in models if m.in_use == 0),
            active_count=self._oneshot.active_count + sum(e.active_count for e in engines),
            engine_waiting=waiting,
            models=tuple(models),
            failed_models=dict(self._failed),
            last_batch_size=max((e.last_batch_size for e in engines), default=0),
        )))
