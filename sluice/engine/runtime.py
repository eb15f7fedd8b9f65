"""The control plane: admit → schedule → route, with one dispatcher thread.

``try_submit`` admits or rejects at once (bounded queue, never a hang); ``submit`` waits
for room. The dispatcher thread pops ONE request at a time from the scheduler, asks the
router for a worker, and offers it to that worker's bounded inbox. It pops only while
some inbox has room; a request whose feasible workers are all full goes back into the
scheduler (keeping its place, its fair-share charge refunded) until capacity frees up.
Deadlines of queued requests are watched here; workers watch those they hold.

Every admitted request ends in exactly one terminal state: the request state machine
guarantees "first terminal wins", and ``stop`` drains, then cancels whatever is left. A
worker that dies or stalls is replaced by the ``Supervisor`` (``sluice.engine.supervisor``),
which ends the requests it held; ``health`` says whether every thread is doing its job.

The asyncio side (``AsyncHandle``, re-exported here) lives in ``sluice.engine.bridge``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from sluice.backends.base import Backend, ModelSpec, Tokenizer
from sluice.backends.faults import FaultInjector, FaultPlan
from sluice.engine.bridge import AsyncHandle
from sluice.engine.continuous import ContinuousEngine
from sluice.engine.observer import Observer
from sluice.engine.request import (
    Event,
    Final,
    Request,
    RequestStatus,
    SamplingParams,
    expired_what,
)
from sluice.engine.sampling_defaults import SamplingDefaults, resolve_defaults
from sluice.engine.supervisor import Recovery, Supervisor, WorkerStatus
from sluice.engine.trace import TraceWriter
from sluice.engine.variants import GroupSpec, PlannerObserver, VariantPlanner
from sluice.engine.worker import Worker, WorkerConfig, WorkerState
from sluice.policy.admission import (
    AdmissionConfig,
    AdmissionPolicy,
    Rejection,
    clamp_retry_after,
)
from sluice.policy.dispatch import Dispatcher
from sluice.policy.keep_alive import KeepAlive
from sluice.policy.rates import RateMeter
from sluice.policy.router import make_router
from sluice.policy.scheduler import make_scheduler
from sluice.policy.types import QueueItem

IDLE_POLL_S = 0.5
DEADLINE_SLACK = 64
"""Deadline-heap entries of finished requests tolerated before a purge (see
``Runtime._purge_deadlines``)."""
MAX_SUPERVISOR_POLL_S = 0.25
"""The supervisor checks heartbeats at least this often (a death wakes it at once)."""

log = logging.getLogger("sluice.runtime")


@dataclass(frozen=True)
class RuntimeConfig:
    """Everything the runtime needs; built from the TOML config (see ``sluice.config``)."""

    models: tuple[ModelSpec, ...]
    workers: tuple[WorkerConfig, ...]
    scheduler: str = "fifo"
    """``fifo``, ``workload_aware``, ``priority_edf`` or ``wfq``."""
    bypass_threshold: int = 8
    router: str = "residency_aware"
    """``round_robin``, ``least_loaded`` or ``residency_aware``."""
    queue_capacity: int = 32
    tenant_weights: Mapping[str, float] = field(default_factory=dict)
    groups: tuple[GroupSpec, ...] = ()
    """Model groups whose requests the variant planner routes to a variant."""
    faults: Mapping[str, FaultPlan] = field(default_factory=dict)
    """Injected faults by model id (tests and the chaos bench only)."""
    trace_path: str | None = None
    """Record every submitted request's arrival here as JSONL (``sluice.engine.trace``,
    the simulator's trace format); ``None`` (default): no recording."""

    def __post_init__(self) -> None:
        if not self.workers:
            raise ValueError("workers: at least one worker is required")
        ids = [m.model_id for m in self.models]
        if len(set(ids)) != len(ids):
            raise ValueError(f"models: duplicate model ids in {ids}")
        if self.queue_capacity < 1:
            raise ValueError(f"queue_capacity must be >= 1, got {self.queue_capacity}")
        biggest = max(w.budget_bytes for w in self.workers)
        for m in self.models:
            if m.memory_bytes > biggest:
                raise ValueError(
                    f"models[{m.model_id!r}].memory_bytes ({m.memory_bytes}) exceeds every "
                    f"worker's budget (largest {biggest}): it could never be served"
                )


class Rejected(Exception):
    """Raised by the async API when admission refuses a request."""

    def __init__(self, rejection: Rejection) -> None:
        super().__init__(rejection.message)
        self.rejection = rejection


@dataclass(frozen=True)
class RuntimeSnapshot:
    """The runtime at one instant, for /status and /metrics."""

    queue_depth: int
    queue_capacity: int
    live_requests: int
    draining: bool
    completions_per_s: float
    workers: tuple[WorkerState, ...]
    inbox_depths: tuple[int, ...]
    worker_status: tuple[WorkerStatus, ...] = ()
    """Per worker slot: ``up``, ``recovering``, ``dead`` or ``stopped``."""


@dataclass(frozen=True)
class RuntimeHealth:
    """Whether the runtime's threads do their jobs (``/health``, ``/ready``)."""

    alive: bool
    """The dispatcher and the supervisor run, and no worker is dead without a replacement
    on the way."""
    workers: tuple[WorkerStatus, ...]
    problem: str = ""
    """What is wrong when not ``alive`` (or which worker recovers)."""

    @property
    def all_up(self) -> bool:
        return all(s == "up" for s in self.workers)


class Runtime:
    """Owns the queue, the dispatcher thread and the workers. Thread-safe."""

    def __init__(
        self,
        config: RuntimeConfig,
        backends: Mapping[str, Backend],
        *,
        clock: Callable[[], float] = time.monotonic,
        observer: Observer | None = None,
    ) -> None:
        self.config = config
        self.specs: dict[str, ModelSpec] = {m.model_id: m for m in config.models}
        self._backends = backends
        self.clock = clock
        self.observer = observer or Observer()
        self._cv = threading.Condition(threading.RLock())
        self._admission = AdmissionPolicy(AdmissionConfig(queue_capacity=config.queue_capacity))
        self._scheduler = make_scheduler(
            config.scheduler,
            bypass_threshold=config.bypass_threshold,
            tenant_weights=config.tenant_weights,
        )
        self._router = make_router(config.router)
        self._dispatcher = Dispatcher(self._scheduler, self._router)
        self._trace = (TraceWriter(config.trace_path, clock()) if config.trace_path is not None
                       else None)
        self._deadlines: list[tuple[float, int]] = []
        self._live: dict[int, Request] = {}
        self._moving: set[int] = set()
        """Requests in an inbox whose move to another variant the worker has yet to make."""
        self._charged: dict[int, int] = {}
        """Dispatched requests → the tokens their pop charged to their tenant's fair share."""
        self._ids = itertools.count(1)
        self._completions = RateMeter(window_s=10.0)
        self._tokenizers: dict[str, Tokenizer] = {}
        self.variants = VariantPlanner(config.groups, self.specs,
                                       [w.budget_bytes for w in config.workers], clock)
        self._worker_observer: Any = PlannerObserver(self.observer, self.variants)
        self._faults = {m: FaultInjector(plan) for m, plan in config.faults.items()}
        self._draining = False
        self._stopped = False
        self.dispatcher_fault: str | None = None
        """Set if the dispatcher thread failed (``/health`` then fails)."""
        self.supervisor = Supervisor(
            lambda: self.workers, self._replace_worker, self._end_held, clock, self.observer,
            poll_s=min(MAX_SUPERVISOR_POLL_S,
                       min(w.watchdog_s for w in config.workers) / 4))
        self.workers = [self._new_worker(w) for w in config.workers]
        self._thread = threading.Thread(target=self._dispatch_loop, name="sluice-dispatch",
                                        daemon=True)

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        for w in self.workers:
            w.start()
        self._thread.start()
        self.supervisor.start()

    def stop(self, drain_timeout_s: float = 10.0) -> int:
        """Stop admitting, let in-flight work finish for up to ``drain_timeout_s``, then
        cancel what is left. Returns how many requests had to be cancelled."""
        deadline = self.clock() + drain_timeout_s
        with self._cv:
            self._draining = True
            while self._live and self.clock() < deadline:
                self._cv.wait(min(0.05, max(0.0, deadline - self.clock())))
            left = list(self._live.values())
            now = self.clock()
            for req in left:
                # Queued or running, the client is told why (``shutdown``); a running one's
                # worker frees its slot at its next step (first terminal state wins).
                self._scheduler.remove(req.request_id)
                req.cancel_requested = True
                req.finish(RequestStatus.CANCELLED, now, error="server shutting down",
                           error_code="shutdown")
            self._stopped = True
            self._cv.notify_all()
        self.supervisor.stop()
        for w in self.workers:
            w.stop()
        for w in self.workers:
            w.join(30.0)
        self._thread.join(5.0)
        if self._trace is not None:
            self._trace.close()
        return len(left)

    def begin_drain(self) -> None:
        """Refuse new requests from now on (503 ``draining``); in-flight work goes on."""
        with self._cv:
            self._draining = True
            self._cv.notify_all()

    @property
    def draining(self) -> bool:
        return self._draining

    # -- requests ------------------------------------------------------------------------

    def tokenizer(self, model_id: str) -> Tokenizer:
        """The (cached) tokenizer of a generative model; loads only its vocabulary."""
        with self._cv:
            tok = self._tokenizers.get(model_id)
        if tok is None:
            spec = self.specs[model_id]
            tok = self._backends[spec.backend].load_tokenizer(spec)
            with self._cv:
                tok = self._tokenizers.setdefault(model_id, tok)
        return tok

    def sampling_defaults(self, model_id: str) -> SamplingDefaults:
        """The sampling a request to ``model_id`` gets for the fields it leaves out: the
        model file's, else the configuration's, else llama-server's
        (``sluice.engine.sampling_defaults``). Loads the model's tokenizer if need be."""
        spec = self.specs[model_id]
        return resolve_defaults(self.tokenizer(model_id).model_sampling, spec.sampling,
                                config_first=spec.sampling_over_model)

    def sampling_params(self, model_id: str, **sent: Any) -> SamplingParams:
        """A request's ``SamplingParams``: the fields it sent (every API passes only those
        its client gave) over ``sampling_defaults``. ``penalty_last_n`` -1 is the whole
        context of one sequence; a ``seed`` sent as ``None`` is not sent."""
        tok = self.tokenizer(model_id)
        given = {k: v for k, v in sent.items() if not (k == "seed" and v is None)}
        fields = {**self.sampling_defaults(model_id).values, **given}
        if fields["penalty_last_n"] == -1:
            fields["penalty_last_n"] = tok.n_ctx_per_seq
        return SamplingParams(**fields)

    def new_request(
        self,
        model_id: str,
        *,
        prompt_tokens: Sequence[int] = (),
        input: Any = None,
        params: SamplingParams | None = None,
        tenant_id: str = "default",
        priority: int = 5,
        deadline_s: float | None = None,
        ttft_deadline_s: float | None = None,
        ttft_target_s: float | None = None,
        keep_alive: KeepAlive | None = None,
    ) -> Request:
        """A request with a fresh id, not yet submitted (attach listeners, then submit).
        ``model_id`` may name a model group: the planner picks the variant at submission.
        A generative request without a first-token deadline gets its model's default
        (``ModelSpec.ttft_deadline_s`` after arrival), if it has one; so for the first-token
        target (``ModelSpec.ttft_target_s``)."""
        spec = self.spec_for(model_id)
        if spec is None:
            raise KeyError(model_id)
        now = self.clock()
        if ttft_deadline_s is None and spec.ttft_deadline_s is not None:
            ttft_deadline_s = now + spec.ttft_deadline_s
        if ttft_target_s is None and spec.ttft_target_s is not None:
            ttft_target_s = now + spec.ttft_target_s
        return Request(
            request_id=next(self._ids),
            model_id=model_id,
            kind=spec.kind,
            arrival_s=now,
            prompt_tokens=tuple(prompt_tokens),
            input=input,
            params=params or SamplingParams(),
            tenant_id=tenant_id,
            priority=priority,
            deadline_s=deadline_s,
            ttft_deadline_s=ttft_deadline_s if spec.kind == "generative" else None,
            ttft_target_s=ttft_target_s if spec.kind == "generative" else None,
            keep_alive=keep_alive,
        )

    def try_submit(self, req: Request) -> Rejection | None:
        """Admit ``req`` into the queue, or reject it at once (it then ends ``REJECTED``)."""
        return self.try_submit_unit([req])

    def try_submit_unit(self, reqs: Sequence[Request]) -> Rejection | None:
        """Admit ``reqs`` (the inputs of one API request) as one unit: one admission
        decision, taken as for a single request, so a request with more inputs than the
        queue holds is still served, never refused for good. All are queued (each a
        scheduling item of cost 1, so their cost is their number) or all end ``REJECTED``.
        The queue may hence hold up to ``queue_capacity - 1 + len(reqs)`` items."""
        now = self.clock()
        for req in reqs:
            req.listeners.append(self._on_event(req))
        named = [req.model_id for req in reqs]
        if self._trace is not None:
            for req, name in zip(reqs, named, strict=True):
                self._trace.record(req, name)
        with self._cv:
            rejection: Rejection | None = None
            for req in reqs:  # a group's requests each get a variant, or the unit is refused
                rejection = rejection or self._plan(req, now)
            if rejection is None and reqs:
                rejection = self._admission_check(reqs[0], now)
            if rejection is None:
                for req, name in zip(reqs, named, strict=True):
                    self._enqueue(req, now)
                    self.variants.admitted(req, name if name in self.variants.groups else None)
        if rejection is not None:
            self._reject(reqs, rejection, now)
        else:
            for req in reqs:
                self.observer.admitted(req)
        return rejection

    def refuse_early(self, reqs: Sequence[Request]) -> Rejection | None:
        """The queue's admission check alone (capacity, draining, deadline against the
        completion rate), for a caller about to do costly work for ``reqs`` (tokenize a
        prompt, compile a grammar): a refusal ends them ``REJECTED`` exactly as
        ``try_submit_unit`` would; ``None`` leaves them untouched, and ``try_submit_unit``
        decides again when they are submitted."""
        if not reqs:
            return None
        now = self.clock()
        with self._cv:
            rejection = self._admission_check(reqs[0], now)
        if rejection is not None:
            for req in reqs:
                req.listeners.append(self._on_event(req))
            self._reject(reqs, rejection, now)
        return rejection

    def _reject(self, reqs: Sequence[Request], rejection: Rejection, now: float) -> None:
        for req in reqs:
            self.observer.rejected(req.model_id, req.tenant_id, rejection.reason)
            req.finish(RequestStatus.REJECTED, now, error=rejection.message,
                       error_code=rejection.reason)

    def submit(self, req: Request, timeout_s: float | None = None) -> Rejection | None:
        """Like ``try_submit`` but waits (up to ``timeout_s``) for room in the queue."""
        deadline = None if timeout_s is None else self.clock() + timeout_s
        with self._cv:
            while self._queue_depth() >= self.config.queue_capacity and not self._draining:
                remaining = None if deadline is None else deadline - self.clock()
                if remaining is not None and remaining <= 0:
                    break
                self._cv.wait(IDLE_POLL_S if remaining is None else min(remaining, IDLE_POLL_S))
        return self.try_submit(req)

    def cancel(self, request_id: int) -> bool:
        """Cancel a live request: removed at once if queued, stopped at the next step if
        running. False if it is unknown or already ended."""
        with self._cv:
            req = self._live.get(request_id)
            if req is None:
                return False
            req.cancel_requested = True
            if self._scheduler.remove(request_id) is not None:
                req.finish(RequestStatus.CANCELLED, self.clock(), error="cancelled by client")
                return True
            worker_id = req.worker_id
        if worker_id is not None:
            self.workers[worker_id].wake()
        return True

    def snapshot(self) -> RuntimeSnapshot:
        now = self.clock()
        with self._cv:
            depth = self._queue_depth()
            live = len(self._live)
            rate = self._completions.rate_per_s(now)
        workers = list(self.workers)
        return RuntimeSnapshot(
            queue_depth=depth,
            queue_capacity=self.config.queue_capacity,
            live_requests=live,
            draining=self._draining,
            completions_per_s=rate,
            workers=tuple(w.state for w in workers),
            inbox_depths=tuple(w.inbox_depth() for w in workers),
            worker_status=self.supervisor.statuses(),
        )

    def health(self) -> RuntimeHealth:
        """Liveness: the dispatcher and supervisor threads run (until ``stop``) and every
        worker is up or being replaced."""
        statuses = self.supervisor.statuses()
        problem = ""
        if self._stopped:  # shutting down: the threads end on purpose
            return RuntimeHealth(alive=True, workers=statuses)
        if self.dispatcher_fault is not None or not self._thread.is_alive():
            problem = f"dispatcher thread is dead ({self.dispatcher_fault or 'ended'})"
        elif not self.supervisor.alive:
            problem = "worker supervisor is dead"
        for i, status in enumerate(statuses):
            if not problem and status in ("dead", "stopped"):
                problem = f"worker {i} is {status} and not being replaced"
        return RuntimeHealth(alive=not problem, workers=statuses, problem=problem)

    def recoveries(self) -> list[Recovery]:
        """Replaced workers, oldest first (the last ``RECOVERY_LOG``)."""
        return list(self.supervisor.recoveries)

    def completions_per_s(self) -> float:
        with self._cv:
            return self._completions.rate_per_s(self.clock())

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
            worker = self.workers[target]
            return [worker.call(lambda: worker.load_now(model_id)).result(timeout=600)]
        futures = [w.call(functools.partial(w.unload_now, model_id)) for w in self.workers]
        return [f.result(timeout=60) for f in futures]

    def erase_slot(self, model_id: str, worker_id: int, slot: int) -> int | None:
        """Forget the retained prefix in slot ``slot`` of ``model_id`` on worker
        ``worker_id`` (``Worker.erase_slot_now``, on its thread): the tokens it held, or
        ``None`` while a request uses the slot. Blocks: call it off the event loop."""
        worker = self.workers[worker_id]
        erase = functools.partial(worker.erase_slot_now, model_id, slot)
        result: int | None = worker.call(erase).result(timeout=60)
        return result

    def on_engine(self, model_id: str, worker_id: int,
                  fn: Callable[[ContinuousEngine], Any]) -> Future[Any]:
        """Run ``fn`` on ``model_id``'s engine on worker ``worker_id``, on that worker's
        thread between two steps (``Worker.on_engine``); the Future fails with
        ``ValueError`` if the model is not resident there then."""
        worker = self.workers[worker_id]
        return worker.call(functools.partial(worker.on_engine, model_id, fn))

    # -- async conveniences (the Python API) ---------------------------------------------

    def open(self, req: Request) -> AsyncHandle:
        """Attach an asyncio event stream to ``req`` and submit it without waiting.
        Raises ``Rejected`` if admission refuses it."""
        handle = AsyncHandle(self, req, asyncio.get_running_loop())
        rejection = self.try_submit(req)
        if rejection is not None:
            raise Rejected(rejection)
        return handle

    def open_unit(self, reqs: Sequence[Request]) -> list[AsyncHandle]:
        """``open`` for the inputs of one API request, admitted as one unit
        (``try_submit_unit``). Raises ``Rejected`` if admission refuses them (all end
        ``REJECTED``)."""
        loop = asyncio.get_running_loop()
        handles = [AsyncHandle(self, req, loop) for req in reqs]
        rejection = self.try_submit_unit(reqs)
        if rejection is not None:
            raise Rejected(rejection)
        return handles

    async def generate(
        self, model_id: str, prompt: str, *, add_bos: bool = True, **params: Any
    ) -> AsyncHandle:
        """Tokenize ``prompt`` and submit a generative request (``params``: the
        ``SamplingParams`` fields to set, the model's defaults for the others); iterate the
        handle's ``tokens()`` or await ``result()``."""
        tokens = self.tokenizer(model_id).tokenize(prompt, add_bos=add_bos)
        req = self.new_request(model_id, prompt_tokens=tokens,
                               params=self.sampling_params(model_id, **params))
        return self.open(req)

    async def infer(self, model_id: str, input: Any) -> Final:
        """Run one one-shot input (e.g. a text to embed) and return its terminal event."""
        return await self.open(self.new_request(model_id, input=input)).result()

    # -- internals -----------------------------------------------------------------------

    def _queue_depth(self) -> int:
        return len(self._scheduler)

    def spec_for(self, name: str) -> ModelSpec | None:
        """A model's spec; for a model group, its first variant's (kind and task)."""
        spec = self.specs.get(name)
        if spec is None and name in self.variants.groups:
            spec = self.variants.lead_spec(name)
        return spec

    def _plan(self, req: Request, now: float) -> Rejection | None:
        """Choose the variant of a group request (rewrites ``req.model_id``), or reject
        it now when no variant is predicted to meet its deadline."""
        group_id = req.model_id
        choice = self.variants.plan(req, now)
        if choice is None:
            return None
        if group_id in self.variants.groups:
            self.observer.planned(group_id, choice.variant, choice.reason)
        if choice.variant is not None:
            return None
        best = min(choice.predictions, key=lambda p: p.sojourn_s)
        limits = self._admission.config
        return Rejection(
            "deadline_infeasible",
            clamp_retry_after(choice.retry_after_s, limits.min_retry_after_s,
                              limits.max_retry_after_s),
            f"deadline infeasible for group {group_id}: the soonest prediction is "
            f"{best.variant} finishing in {best.sojourn_s:.3g} s (wait {best.wait_s:.3g} s + "
            f"service {best.service_s:.3g} s), {(req.deadline_s or now) - now:.3g} s left",
        )

    def _admission_check(self, req: Request, now: float) -> Rejection | None:
        return self._admission.decide(
            queue_depth=self._queue_depth(),
            completions_per_s=self._completions.rate_per_s(now),
            now=now,
            deadline_s=req.deadline_s,
            draining=self._draining,
        )

    def _enqueue(self, req: Request, now: float) -> None:
        self._live[req.request_id] = req
        req.mark_queued(now)
        self._scheduler.push(
            QueueItem(
                request_id=req.request_id,
                model_id=req.model_id,
                arrival_s=req.arrival_s,
                tenant_id=req.tenant_id,
                priority=req.priority,
                deadline_s=req.deadline_s,
                cost_tokens=len(req.prompt_tokens) + req.params.max_tokens
                if req.kind == "generative" else 1,
            )
        )
        start_by = req.start_by_s
        if start_by is not None:
            heapq.heappush(self._deadlines, (start_by, req.request_id))
        self._cv.notify_all()

    def _on_event(self, req: Request) -> Callable[[Event], None]:
        last_token_s: dict[int, float] = {}  # per choice

        def on_event(event: Event) -> None:
            if not isinstance(event, Final):
                if event.token_id >= 0:  # not the text a retiring sequence flushes
                    previous = last_token_s.get(event.choice)
                    last_token_s[event.choice] = event.time_s
                    if previous is not None:
                        self.observer.token_gap(req.model_id, event.time_s - previous)
                return
            now = self.clock()
            self.variants.finished(req)
            with self._cv:
                self._live.pop(req.request_id, None)
                self._purge_deadlines()
                self._settle_share(req, event)
                if event.status == RequestStatus.COMPLETED:
                    self._completions.record(now)
                self._cv.notify_all()
            self.observer.finished(req)

        return on_event

    def _notify(self) -> None:
        with self._cv:
            self._cv.notify_all()

    # -- supervision ---------------------------------------------------------------------

    def _new_worker(self, config: WorkerConfig) -> Worker:
        return Worker(config, self.specs, self._backends, self.clock, self._worker_observer,
                      self._notify, faults=self._faults, on_death=self.supervisor.wake,
                      busy_models=self.busy_models)

    def busy_models(self) -> frozenset[str]:
        """Models with a live request (queued, routed or running): their keep-alive does not
        run out while it lives, so no admitted request waits on a model just unloaded."""
        with self._cv:
            return frozenset(r.model_id for r in self._live.values())

    def _replace_worker(self, index: int) -> Worker:
        """A fresh worker in slot ``index`` (same id and limits), started (supervisor)."""
        worker = self._new_worker(self.workers[index].config)
        with self._cv:
            self.workers[index] = worker
            worker.start()
            self._cv.notify_all()  # requests held back from the dead one may go there now
        return worker

    def _end_held(self, worker_id: int, message: str) -> int:
        """End (FAILED, ``worker_failed``) every live request routed to ``worker_id``,
        whose worker was abandoned (it takes no more); returns how many ended."""
        with self._cv:
            held = [r for r in self._live.values() if r.worker_id == worker_id]
        now = self.clock()
        return sum(r.finish(RequestStatus.FAILED, now, error=message,
                            error_code="worker_failed") for r in held)

    def _dispatch_loop(self) -> None:
        try:
            self._dispatch_forever()
        except BaseException as exc:
            # Nothing dispatches any more: refuse new work (``/health`` fails, so the
            # process gets restarted) and end the queued requests rather than leave them.
            self.dispatcher_fault = type(exc).__name__
            log.exception("the dispatcher thread failed; no request is dispatched any more")
            with self._cv:
                self._draining = True
                queued = [r for r in self._live.values() if r.worker_id is None]
                for req in queued:
                    self._scheduler.remove(req.request_id)
            now = self.clock()
            for req in queued:
                req.finish(RequestStatus.FAILED, now, error="the dispatcher failed; the "
                           "server must be restarted", error_code="internal_error")

    def _dispatch_forever(self) -> None:
        while True:
            with self._cv:
                if self._stopped:
                    return
                now = self.clock()
                self._expire_queued(now)
                self._replan_queued(now)
                moved = self._dispatch(now)
                if not moved:
                    wait = IDLE_POLL_S
                    if self._deadlines:
                        wait = min(wait, max(0.0, self._deadlines[0][0] - now))
                    self._cv.wait(wait)

    def _purge_deadlines(self) -> None:
        """Drop the deadline entries of finished requests once they outnumber the live ones,
        so the heap holds at most ``2 * live + DEADLINE_SLACK`` entries however far off the
        deadlines are (amortised O(1) per request). Under ``self._cv``."""
        if len(self._deadlines) <= 2 * len(self._live) + DEADLINE_SLACK:
            return
        self._deadlines = [e for e in self._deadlines if e[1] in self._live]
        heapq.heapify(self._deadlines)

    @property
    def deadline_entries(self) -> int:
        """Entries in the deadline heap (at most ``2 * live + DEADLINE_SLACK``)."""
        with self._cv:
            return len(self._deadlines)

    def _expire_queued(self, now: float) -> None:
        while self._deadlines and self._deadlines[0][0] <= now:
            _, request_id = heapq.heappop(self._deadlines)
            req = self._live.get(request_id)
            if req is not None and self._scheduler.remove(request_id) is not None:
                req.finish(RequestStatus.EXPIRED, now,
                           error=f"{expired_what(req, now)} passed while queued",
                           error_code="deadline")

    def _replan_queued(self, now: float) -> None:
        """Queued group requests whose predicted finish now misses their deadline move to
        a faster variant (keeping their place), or fail now with ``deadline_infeasible``
        instead of expiring in the queue. In the scheduler the move is made here; in a
        worker's inbox the worker makes it on its thread, between batches. Under
        ``self._cv``."""
        if not self.variants.groups or not self._live:
            return
        for req, variant in self.variants.replan(now, self._movable):
            group_id = self.variants.group_of(req.model_id)
            if variant is None:
                if self._scheduler.remove(req.request_id) is None and req.worker_id is None:
                    continue
                self.observer.planned(group_id, None, "deadline_infeasible")
                req.finish(RequestStatus.REJECTED, now, error_code="deadline_infeasible",
                           error=f"deadline infeasible for group {group_id}: queued on "
                                 f"{req.model_id}, no variant can finish it in time now")
                continue
            item = self._scheduler.remove(req.request_id)
            if item is not None:
                self.variants.moved(req, variant)
                self._scheduler.push(dataclasses.replace(item, model_id=variant))
            elif req.worker_id is not None:
                self._moving.add(req.request_id)
                self.variants.moved(req, variant, apply=False)
                done = self.workers[req.worker_id].retarget(
                    req, functools.partial(self.variants.apply_move, req, variant))
                done.add_done_callback(functools.partial(self._moved, req.request_id))
            else:
                continue
            self.observer.planned(group_id, variant, "replanned")

    def _movable(self, request_id: int) -> bool:
        """Queued (in the scheduler, or waiting in an inbox with no move pending)."""
        if request_id in self._scheduler:
            return True
        req = self._live.get(request_id)
        return (req is not None and req.worker_id is not None
                and req.status == RequestStatus.QUEUED and request_id not in self._moving)

    def _moved(self, request_id: int, _: object) -> None:
        with self._cv:
            self._moving.discard(request_id)

    def _dispatch(self, now: float) -> bool:
        """Route queued requests while the queue is non-empty and some inbox has room (the
        decisions are ``sluice.policy.dispatch``'s; this applies them)."""
        moved = False
        while True:
            views = [w.view() for w in self.workers]
            d = self._dispatcher.next(now, views, self._model_bytes, self._is_live)
            if d is None or d.put_back:
                break
            req = self._live[d.item.request_id]
            if d.rejected:
                req.finish(RequestStatus.REJECTED, now, error=d.reason,
                           error_code="no_feasible_worker")
                continue
            if d.worker_id is None or not self.workers[d.worker_id].offer(req):
                self._dispatcher.put_back(d.item)
                break
            req.route_reason = d.reason
            self._charged[req.request_id] = d.item.cost_tokens
            moved = True
        if moved:
            self._cv.notify_all()  # submitters waiting for room
        return moved

    def _model_bytes(self, model_id: str) -> int:
        return self.specs[model_id].memory_bytes

    def _is_live(self, request_id: int) -> bool:
        req = self._live.get(request_id)
        return req is not None and not req.is_terminal

    def _settle_share(self, req: Request, final: Final) -> None:
        """Correct the fair-share charge of a dispatched request to the tokens it was really
        served (none if it never ran). Under ``self._cv``."""
        charged = self._charged.pop(req.request_id, None)
        if charged is None:
            return
        served = 0
        if req.times.started_s is not None:
            served = (final.prompt_tokens + final.completion_tokens
                      if req.kind == "generative" else 1)
        if served != charged:
            self._scheduler.on_served(req.tenant_id, served - charged)


__all__ = [
    "AsyncHandle",
    "Rejected",
    "Runtime",
    "RuntimeConfig",
    "RuntimeHealth",
    "RuntimeSnapshot",
]
