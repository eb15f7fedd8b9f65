"""A worker: one execution thread that owns a resident set, its loaded models, a
continuous-batching engine per resident generative model, and one one-shot executor
(``sluice.engine.oneshot``) for its one-shot models.

The control plane talks to it only through ``offer`` (a request for its inbox),
``call`` (run a closure on its thread: admin load/unload) and ``stop``; it reads back
immutable ``WorkerState`` snapshots and the thread's ``Heartbeat``. The thread stamps the
heartbeat before every piece of work (a step, a batch, a load, an idle wait) with how long
that piece may take; ``sluice.engine.supervisor`` declares the worker dead when its thread
died (``fault`` says how) or a stamp is overdue while it holds work, and ``abandon``s it.

The inbox is served in order: a generative request
at the head moves into its model's engine, a one-shot request at the head starts a
dynamic batch of the contiguous same-model requests behind it.
"""

from __future__ import annotations

import sys
import threading
import traceback
from collections import deque
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, Literal

from sluice.backends.base import Backend, GenerativeModel, ModelSpec, OneShotModel
from sluice.backends.faults import FaultInjector
from sluice.engine.continuous import ContinuousEngine, EngineConfig, SlotState
from sluice.engine.observer import Observer
from sluice.engine.oneshot import OneShotExecutor
from sluice.engine.request import Request, RequestStatus, end_stopped, is_stopped
from sluice.engine.speculation import SpeculationState
from sluice.engine.step_times import StepBucket
from sluice.policy.keep_alive import KeepAlive, configured_keep_alive, effective_keep_alive
from sluice.policy.residency import Residency
from sluice.policy.step_cost import StepCost
from sluice.policy.tpot_margin import MarginState
from sluice.policy.types import WorkerView
from sluice.policy.width import WidthPlan

IDLE_POLL_S = 0.5
"""Longest sleep of an idle worker (it is woken at once by new work)."""


@dataclass(frozen=True)
class WorkerConfig:
    """One worker's limits."""

    worker_id: int
    budget_bytes: int
    """Model memory budget (estimated bytes)."""
    inbox_capacity: int = 8
    """Requests routed here and not yet running, at most."""
    eviction: str = "lru"
    """``lru`` or ``cost_aware``."""
    max_batch_size: int = 8
    """One-shot dynamic batches: members at most."""
    max_wait_s: float = 0.005
    """One-shot dynamic batches: how long the head waits for company."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    watchdog_s: float = 30.0
    """A worker holding work that shows no progress for this long (one step, one batch)
    is declared dead and replaced."""
    load_watchdog_s: float = 600.0
    """The same allowance while it loads a model, runs a freshly loaded model's first
    step, or runs an admin call."""

    def __post_init__(self) -> None:
        for name in ("watchdog_s", "load_watchdog_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value}")


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The worker thread's last sign of progress: at ``stamp_s`` it began ``activity``,
    which may take ``allowance_s`` before the next stamp is due."""

    stamp_s: float
    allowance_s: float
    activity: str

    def overdue_s(self, now: float) -> float:
        """Seconds past the allowance (negative while it is still due)."""
        return now - self.stamp_s - self.allowance_s


@dataclass(frozen=True, slots=True)
class WorkerFault:
    """Why a worker's thread ended unexpectedly: ``cause`` for clients and metrics (no
    exception text: it may name files), ``detail`` (the traceback) for the log."""

    cause: str
    detail: str
    time_s: float


@dataclass(frozen=True)
class ModelState:
    """A resident model as the status page shows it."""

    model_id: str
    memory_bytes: int
    in_use: int
    use_count: int
    kv_free_blocks: int | None = None
    kv_total_blocks: int | None = None
    running: int = 0
    waiting: int = 0
    prefix_hit_tokens: int = 0
    """Prompt tokens whose KV was copied from a running sequence instead of computed
    (cumulative for this load of the model)."""
    step_cost: StepCost | None = None
    """Generative: the step-time model its engine learned from the steps it ran (what
    ``sluice simulate`` needs as the model's cost under this load), or its prior."""
    step_samples: int = 0
    """Generative: the recent steps its engine keeps to fit ``step_cost`` on (until there
    are enough, ``step_cost`` is the prior)."""
    tpot_margin: MarginState | None = None
    """Generative: the share of its TPOT target a planned step may take, learned from the
    measured cycles against ``step_cost``'s predictions (``sluice.policy.tpot_margin``)."""
    width: WidthPlan | None = None
    """Generative: its engine's last decision of how many sequences decode at once with
    requests waiting, and why (``sluice.policy.width``: the TPOT target's width, or
    widened for the line's first-token targets)."""
    step_times: Mapping[str, StepBucket] = field(default_factory=dict)
    """Generative: every step its engine ran since the model loaded, by decodes and
    whether it fed a prompt (``sluice.engine.step_times``): the measured table beside the
    learned line, which a simulator's cost file takes as two snapshots' difference."""
    speculation: SpeculationState | None = None
    """Generative: its engine's drafted and accepted tokens since the model loaded, and
    its last verifying step's (``sluice.engine.speculation``)."""
    loaded_at_s: float = 0.0
    """When it finished loading (the runtime's clock)."""
    keep_alive: str = "until evicted"
    """``pinned``, ``until evicted`` or its idle time (``300s``): ``KeepAlive.describe``."""
    keep_alive_idle_s: float | None = None
    """Its keep-alive's idle time (``None``: pinned or until evicted)."""
    expires_at_s: float | None = None
    """When it unloads if no request comes first (the runtime's clock); ``None`` while in
    use, pinned, or kept until evicted."""
    slots: tuple[SlotState, ...] = ()
    """Generative: its engine's sequence slots (llama-server's ``/slots``)."""


@dataclass(frozen=True)
class WorkerState:
    """An immutable snapshot published by the worker thread after every loop."""

    worker_id: int
    budget_bytes: int
    resident_bytes: int = 0
    evictable_bytes: int = 0
    active_count: int = 0
    engine_waiting: int = 0
    models: tuple[ModelState, ...] = ()
    failed_models: Mapping[str, str] = field(default_factory=dict)
    last_batch_size: int = 0

    @property
    def resident(self) -> frozenset[str]:
        return frozenset(m.model_id for m in self.models)


Readiness = Literal["ready", "wait", "failed"]


class Worker:
    """Owns one thread; see the module docstring for the protocol."""

    def __init__(
        self,
        config: WorkerConfig,
        specs: Mapping[str, ModelSpec],
        backends: Mapping[str, Backend],
        clock: Callable[[], float],
        observer: Observer,
        on_capacity: Callable[[], None],
        *,
        faults: Mapping[str, FaultInjector] | None = None,
        on_death: Callable[[], None] = lambda: None,
        busy_models: Callable[[], Collection[str]] = frozenset,
    ) -> None:
        """``faults``: injectors armed on the models they name as they load (tests, chaos
        bench); ``on_death``: called from the thread as it dies (wakes the supervisor);
        ``busy_models``: models with requests anywhere in the runtime (their keep-alive
        waits; called from the worker thread without the worker's lock held)."""
        self.config = config
        self._specs = specs
        self._backends = backends
        self._clock = clock
        self._observer = observer
        self._on_capacity = on_capacity
        self._faults = faults or {}
        self._on_death = on_death
        self._busy_models = busy_models
        self._cv = threading.Condition()
        self._inbox: deque[tuple[Request, float]] = deque()
        self._controls: deque[Callable[[], None]] = deque()
        self._pending_calls: set[Future[Any]] = set()
        self._dirty = False
        self._stopping = False
        self.abandoned = False
        """Given up by the supervisor (lock held to write): refuses work, never serves again."""
        self.fault: WorkerFault | None = None
        """Set by the thread as it dies of an exception."""
        self.heartbeat = Heartbeat(clock(), config.load_watchdog_s, "starting")
        self._engine_waiting = 0
        """Requests moved into engines and not yet running (lock held to read or write;
        raised on every move, recomputed after every loop, so it never undercounts)."""
        # Owned by the worker thread only:
        self._residency = Residency(config.budget_bytes, config.eviction)
        self._models: dict[str, OneShotModel | GenerativeModel] = {}
        self._engines: dict[str, ContinuousEngine] = {}
        self._failed: dict[str, str] = {}
        self._loaded_at_s: dict[str, float] = {}
        self._oneshot = OneShotExecutor(
            config.worker_id,
            max_batch_size=config.max_batch_size,
            max_wait_s=config.max_wait_s,
            clock=clock,
            observer=observer,
            on_start=self._batch_started,
            on_end=self._batch_ended,
        )
        self.state = WorkerState(worker_id=config.worker_id, budget_bytes=config.budget_bytes)
        self.trace: list[tuple[str, tuple[int, ...]]] | None = None
        """When a list, every inbox change is appended (tests replay it): ``("offer",
        (id,))``, ``("leave", (id,))``, ``("engine", (id,))``, ``("batch", ids)``."""
        self._thread = threading.Thread(
            target=self._run, name=f"sluice-worker-{config.worker_id}", daemon=True
        )

    # -- control-plane side (any thread) -------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def offer(self, req: Request) -> bool:
        """Put a request in the inbox; False if the inbox is full or the worker stops."""
        with self._cv:
            if self._stopping or self._queue_depth() >= self.config.inbox_capacity:
                return False
            req.worker_id = self.config.worker_id
            self._inbox.append((req, self._clock()))
            self._trace("offer", req)
            self._dirty = True
            self._cv.notify()
            return True

    def wake(self) -> None:
        """Look at the inbox again soon (a request was cancelled)."""
        with self._cv:
            self._dirty = True
            self._cv.notify()

    def call(self, fn: Callable[[], Any]) -> Future[Any]:
        """Run ``fn`` on the worker thread between steps; its result comes back in a Future."""
        fut: Future[Any] = Future()

        def run() -> None:
            try:
                result = fn()
            except Exception as exc:
                _settle(fut, exc=exc)
            else:
                _settle(fut, result=result)
            with self._cv:
                self._pending_calls.discard(fut)

        with self._cv:
            if self._stopping:
                fut.set_exception(RuntimeError("worker is stopping"))
                return fut
            self._controls.append(run)
            self._pending_calls.add(fut)
            self._dirty = True
            self._cv.notify()
        return fut

    def retarget(self, req: Request, apply: Callable[[], None]) -> Future[Any]:
        """Run ``apply`` (which changes ``req``'s model) on the worker thread between
        batches, if ``req`` is still waiting in this inbox then; the Future's result says
        whether it ran. (The worker reads a waiting request's model only on its thread,
        so a change made there cannot split a batch it is forming.)"""
        def run() -> bool:
            with self._cv:
                waiting = any(r is req for r, _ in self._inbox)
            if waiting and not req.is_terminal:
                apply()
                return True
            return False

        return self.call(run)

    def stop(self) -> None:
        """Cancel what is left and end the thread (the runtime drains first)."""
        with self._cv:
            self._stopping = True
            self._cv.notify()

    def join(self, timeout_s: float | None = None) -> None:
        self._thread.join(timeout_s)

    def is_alive(self) -> bool:
        """The worker's thread is running."""
        return self._thread.is_alive()

    @property
    def stopped_on_purpose(self) -> bool:
        """``stop`` was called (not a death, not an abandonment)."""
        return self._stopping and not self.abandoned

    def holds_work(self) -> bool:
        """Requests are waiting in its inbox or engines, or running on it."""
        with self._cv:
            depth = self._queue_depth()
        return depth > 0 or self.state.active_count > 0

    def abandon(self, reason: str) -> None:
        """Give up on this worker (the supervisor replaces it): it takes no more work, its
        pending admin calls fail with ``reason``, and its thread ends (closing its models)
        if it ever resumes. Its requests are the supervisor's to end."""
        with self._cv:
            self.abandoned = True
            self._stopping = True
            pending = list(self._pending_calls)
            self._pending_calls.clear()
            self._cv.notify()
        for fut in pending:
            _settle(fut, exc=RuntimeError(reason))

    def close_models(self) -> None:
        """Release the models of a worker whose thread is dead (no one else uses them)."""
        if self._thread.is_alive():
            raise RuntimeError(f"worker {self.config.worker_id}: its thread still runs")
        for model_id in list(self._models):
            self._models.pop(model_id).close()
        self._engines.clear()

    def stack(self) -> str:
        """Where the thread is now (for the log of a stalled worker)."""
        frame = sys._current_frames().get(self._thread.ident or -1)
        return "".join(traceback.format_stack(frame)) if frame is not None else ""

    def view(self) -> WorkerView:
        """What the router needs, consistent with the inbox at this instant."""
        state = self.state
        with self._cv:
            depth = self._queue_depth()
        return WorkerView(
            worker_id=self.config.worker_id,
            queue_depth=depth,
            active_count=state.active_count,
            inbox_free=0 if self._stopping else max(0, self.config.inbox_capacity - depth),
            budget_bytes=self.config.budget_bytes,
            free_bytes=self.config.budget_bytes - state.resident_bytes,
            resident=state.resident,
            evictable_bytes=state.evictable_bytes,
        )

    def inbox_depth(self) -> int:
        with self._cv:
            return self._queue_depth()

    def _trace(self, what: str, *reqs: Request) -> None:
        """Record an inbox change (lock held)."""
        if self.trace is not None:
            self.trace.append((what, tuple(r.request_id for r in reqs)))

    def _queue_depth(self) -> int:
        return len(self._inbox) + self._engine_waiting

    # -- worker thread -------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # a bug outside every barrier, or an injected kill
            self.fault = WorkerFault(f"died (its thread ended: {type(exc).__name__})",
                                     traceback.format_exc(), self._clock())
            self._on_death()
            return
        self._shutdown()

    def _serve(self) -> None:
        while True:
            with self._cv:
                controls = list(self._controls)
                self._controls.clear()
                stopping = self._stopping
                self._dirty = False
            for control in controls:
                self._beat("admin call", self.config.load_watchdog_s)
                control()
            if stopping:
                break
            did = self._loop_once()
            if not did:
                self._sleep()

    def _beat(self, activity: str, allowance_s: float) -> None:
        """Stamp the heartbeat: ``activity`` begins now and may take ``allowance_s``."""
        self.heartbeat = Heartbeat(self._clock(), allowance_s, activity)

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
                    self._observer.batch(
                        self.config.worker_id, engine.model.spec.model_id, engine.last_batch_size
                    )
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
            wake.extend(t for t in (r.start_by_s for r, _ in self._inbox) if t is not None)
            if not self._dirty and not self._stopping and not self._controls:
                wait_s = max(0.0, min(wake) - now)
                self._beat("idle", wait_s + self.config.watchdog_s)
                self._cv.wait(wait_s)

    def _sweep_inbox(self, now: float) -> None:
        """Cancelled and expired requests leave the inbox without running."""
        with self._cv:
            if not any(is_stopped(r, now) for r, _ in self._inbox):
                return
            kept: deque[tuple[Request, float]] = deque()
            gone: list[Request] = []
            for item in self._inbox:
                if is_stopped(item[0], now):
                    gone.append(item[0])
                    self._trace("leave", item[0])
                else:
                    kept.append(item)
            self._inbox = kept
        for req in gone:
            end_stopped(req, now, "while queued at the worker")
        self._on_capacity()

    def _advance_inbox(self, now: float) -> bool:
        """Serve the inbox head: generative → its engine; one-shot → a dynamic batch."""
        did = False
        self._oneshot.clear_wakeup()
        while True:
            with self._cv:
                if not self._inbox:
                    return did
                req, enqueued_s = self._inbox[0]
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
                self._engines[spec.model_id].add(req)
                did = True
                continue
            with self._cv:
                model_ids = [r.model_id for r, _ in self._inbox]
            take = self._oneshot.plan(model_ids, enqueued_s, now)
            if take == 0:
                return did
            with self._cv:
                batch = [self._inbox.popleft()[0] for _ in range(take)]
                self._trace("batch", *batch)
            self._on_capacity()
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

    def _batch_ended(self, model_id: str) -> None:
        self._residency.release(model_id, self._clock())

    # -- residency -----------------------------------------------------------------------

    def _keep_alive_after(self, spec: ModelSpec, req: Request) -> None:
        """The latest request's ``keep_alive`` holds for its model (Ollama's rule)."""
        self._residency.set_keep_alive(
            spec.model_id, effective_keep_alive(spec_keep_alive(spec), req.keep_alive))

    def _unload_expired(self, now: float) -> bool:
        """Unload the idle models whose keep-alive ran out; a model with a request anywhere
        (this inbox, its engine, the runtime's queue) stays."""
        due = self._residency.expired(now)
        if not due:
            return False
        with self._cv:
            busy = {r.model_id for r, _ in self._inbox}
        busy.update(m for m, e in self._engines.items() if e.has_work)
        busy.update(self._busy_models())
        gone = self._residency.expired(now, busy)
        for model_id in gone:
            self._unload(model_id)
            self._observer.model_idle_unloaded(self.config.worker_id, model_id)
        return bool(gone)

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
            self.load(spec)
        except Exception as exc:
            self._failed[spec.model_id] = str(exc)
            self._observer.model_load_failed(self.config.worker_id, spec.model_id, str(exc))
            self._fail_model_requests(
                spec.model_id, f"model {spec.model_id} failed to load: {exc}", "model_load_failed"
            )
            return "failed"
        return "ready"

    def load(self, spec: ModelSpec) -> None:
        """Load ``spec`` now (worker thread only); the caller made room."""
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
        self._observer.model_loaded(self.config.worker_id, spec.model_id, seconds)
        self._publish()

    def _unload(self, model_id: str) -> None:
        self._residency.evict(model_id)
        self._loaded_at_s.pop(model_id, None)
        self._residency.check_integrity()
        self._engines.pop(model_id, None)
        self._models.pop(model_id).close()
        self._observer.model_evicted(self.config.worker_id, model_id)

    def load_now(self, model_id: str) -> bool:
        """Admin: make ``model_id`` resident (worker thread; via ``call``)."""
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
        """Admin: unload ``model_id`` if resident and idle (worker thread; via ``call``)."""
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
        self._on_capacity()

    def _fail_model_requests(self, model_id: str, message: str, code: str) -> None:
        with self._cv:
            mine = [r for r, _ in self._inbox if r.model_id == model_id]
            for r in mine:
                self._trace("leave", r)
            self._inbox = deque(item for item in self._inbox if item[0].model_id != model_id)
        now = self._clock()
        for r in mine:
            r.finish(RequestStatus.FAILED, now, error=message, error_code=code)
        self._on_capacity()

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
                    speculation=engine.speculation if engine else None,
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
            self._on_capacity()
        self.state = WorkerState(
            worker_id=self.config.worker_id,
            budget_bytes=self.config.budget_bytes,
            resident_bytes=self._residency.resident_bytes,
            evictable_bytes=sum(m.memory_bytes for m in models if m.in_use == 0),
            active_count=self._oneshot.active_count + sum(e.active_count for e in engines),
            engine_waiting=waiting,
            models=tuple(models),
            failed_models=dict(self._failed),
            last_batch_size=max((e.last_batch_size for e in engines), default=0),
        )

    def _shutdown(self) -> None:
        now = self._clock()
        with self._cv:
            left = [r for r, _ in self._inbox]
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



def spec_keep_alive(spec: ModelSpec) -> KeepAlive:
    """A model's keep-alive from its configuration."""
    return configured_keep_alive(spec.keep_alive_s, spec.pinned)


def _settle(fut: Future[Any], *, result: Any = None, exc: BaseException | None = None) -> None:
    """Resolve ``fut`` unless it already is (an abandoned worker's call may be failed by
    the supervisor and later finished by the thread)."""
    try:
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result)
    except InvalidStateError:
        pass
