"""A simulated worker: the server worker's loop on the virtual clock.

One execution resource, as the real worker's one thread: a loop serves the inbox head
(a generative request moves into its model's engine; a one-shot request starts a dynamic
batch of the contiguous same-model requests behind it, through ``decide_batch``), loading
the model first when it is not resident (``Residency.plan_load``: evicting victims, or
waiting while they are in use), then steps every engine with work. A load, a batch and
the engines' steps each keep the worker busy for their modelled seconds; the loop goes
on at the end of each, and sleeps when nothing is left until an offer, a released model
or a batching wait wakes it.

The router sees the same ``WorkerView`` numbers: inbox + engine-waiting as queue depth,
running batch members and sequences as active.
"""

from __future__ import annotations

import functools
import random
from collections import deque
from collections.abc import Mapping
from typing import Protocol

from sluice.policy.capacity.residency import Residency
from sluice.policy.step.step_data import StepPlan
from sluice.policy.types import WorkerView
from sluice.policy.variants.batcher import decide_batch
from sluice.sim.clock import EventLoop
from sluice.sim.engine import SimEngine
from sluice.sim.request import SimRequest
from sluice.sim.setup import SimConfig, SimModel


class Owner(Protocol):
    """What a worker tells its replica."""

    def ended(self, req: SimRequest, status: str, now: float, reason: str | None) -> None: ...

    def capacity(self, now: float) -> None: ...

    def loaded(self, worker_id: int, model_id: str) -> None: ...

    def unloaded(self, worker_id: int, model_id: str) -> None: ...

    def batch_started(self, worker_id: int, model_id: str, batch: list[SimRequest],
                      now: float) -> None: ...

    def batch_done(self, worker_id: int, model_id: str, size: int, seconds: float) -> None: ...


class SimWorker:
    """See the module docstring. ``busy_s`` sums the seconds it was executing."""

    def __init__(self, worker_id: int, config: SimConfig, loop: EventLoop,
                 owner: Owner, seed: int = 0) -> None:
        self.worker_id = worker_id
        self.config = config
        self.models: Mapping[str, SimModel] = config.models
        self.loop = loop
        self.owner = owner
        self.inbox: deque[tuple[SimRequest, float]] = deque()
        self.residency = Residency(config.worker.budget_bytes, config.worker.eviction)
        self.engines: dict[str, SimEngine] = {}
        self.busy = False
        self.oneshot_active = 0
        self.busy_s = 0.0
        self.loads = 0
        self._wake_at: float | None = None
        self._view: WorkerView | None = None
        self._resident: frozenset[str] = frozenset()
        self._rng = random.Random(seed)
        """Step and batch time draws (``ModelCost.cv``); seeded, so runs repeat."""

    # -- the replica's side ----------------------------------------------------------------

    def view(self) -> WorkerView:
        """What the router sees (cached until the worker's state changes)."""
        v = self._view
        if v is None:
            waiting = sum(len(e.waiting) for e in self.engines.values())
            depth = len(self.inbox) + waiting
            active = self.oneshot_active + sum(len(e.running) for e in self.engines.values())
            res = self.residency
            v = self._view = WorkerView(
                worker_id=self.worker_id, queue_depth=depth, active_count=active,
                inbox_free=max(0, self.config.worker.inbox_capacity - depth),
                budget_bytes=res.budget_bytes, free_bytes=res.free_bytes,
                resident=self._resident, evictable_bytes=res.evictable_bytes,
            )
        return v

    def offer(self, req: SimRequest, now: float) -> bool:
        """Into the inbox (False when full), and wake the loop."""
        if self.view().inbox_free <= 0:
            return False
        req.worker = self.worker_id
        req.enqueued_s = now
        self.inbox.append((req, now))
        self._view = None
        self.wake(now)
        return True

    def withdraw(self, req: SimRequest) -> None:
        """Take ``req`` out of the inbox (the replica ends it: a replan found no variant
        that meets its deadline)."""
        self.inbox = deque(i for i in self.inbox if i[0] is not req)
        self._view = None

    def wake(self, now: float) -> None:
        """Run the loop at ``now`` unless busy (it runs when the work in hand ends)."""
        if not self.busy and (self._wake_at is None or self._wake_at > now):
            self._wake_at = now
            self.loop.at(now, self._on_wake)

    # -- the loop ----------------------------------------------------------------------------

    def _on_wake(self, now: float, _arg: object) -> None:
        if self._wake_at is not None and now < self._wake_at:
            return  # superseded by a later schedule
        self._wake_at = None
        if not self.busy:
            self._run(now)

    def _run(self, now: float) -> None:
        self._view = None
        self._sweep(now)
        self._unload_expired(now)
        if self._advance_inbox(now):
            return  # a load or a batch runs; the loop goes on when it ends
        self._step_engines(now)

    def _sweep(self, now: float) -> None:
        """Expired requests (past their deadline, or their first-token deadline) leave the
        inbox without running."""
        if not any(r.missed_start(now) for r, _ in self.inbox):
            return
        kept: deque[tuple[SimRequest, float]] = deque()
        for item in self.inbox:
            r = item[0]
            if r.missed_start(now):
                self.owner.ended(r, "expired", now, "deadline")
            else:
                kept.append(item)
        self.inbox = kept
        self.owner.capacity(now)

    def _advance_inbox(self, now: float) -> bool:
        """Serve the inbox head; True when the worker became busy (a load or a batch)."""
        while self.inbox:
            req, enqueued_s = self.inbox[0]
            model = self.models[req.model]
            if not self.residency.is_resident(model.model_id):
                started = self._load(model, now)
                if started is None:
                    return False  # victims are in use: wait for a release
                if started:
                    return True
                continue  # it could never fit: its requests failed
            if model.kind == "generative":
                self.inbox.popleft()
                engine = self.engines[model.model_id]
                refusal = engine.refusal(req, now)
                if refusal is not None:
                    status = "rejected" if refusal == "deadline_infeasible" else "failed"
                    self.owner.ended(req, status, now, refusal)
                    continue
                self.residency.acquire(model.model_id, now)
                engine.waiting.append(req)
                continue
            decision = decide_batch([r.model for r, _ in self.inbox], enqueued_s, now,
                                    max_batch_size=self.config.worker.max_batch_size,
                                    max_wait_s=self.config.worker.max_wait_s)
            if decision.take == 0:
                if decision.wait_until_s is not None:
                    self._wake_later(decision.wait_until_s)
                return False
            batch = [self.inbox.popleft()[0] for _ in range(decision.take)]
            self.owner.capacity(now)
            self._run_batch(model, batch, now)
            return True
        return False

    def _unload_expired(self, now: float) -> None:
        """Unload the idle models whose keep-alive ran out (as the server's worker does); a
        model with requests in this inbox or its engine stays."""
        if not self.residency.expired(now):
            return
        busy = {r.model for r, _ in self.inbox}
        busy.update(m for m, e in self.engines.items() if e.has_work)
        for model_id in self.residency.expired(now, busy):
            self.residency.evict(model_id)
            self.engines.pop(model_id, None)
            self._resident = frozenset(m.model_id for m in self.residency.models())
            self._view = None
            self.owner.unloaded(self.worker_id, model_id)

    def preload(self, model: SimModel) -> None:
        """Make ``model`` resident before the run (no time charged: the server loads its
        default model before it reports ready)."""
        if self.residency.is_resident(model.model_id):
            return
        plan = self.residency.plan_load(model.model_id, model.memory_bytes)
        if plan is None or plan.victims:
            return
        self._commit(model, 0.0)

    def _commit(self, model: SimModel, now: float) -> None:
        self.residency.commit_load(model.model_id, model.memory_bytes, model.load_cost_s, now,
                                   model.keep_alive)
        if model.kind == "generative":
            step = model.cost.step
            if step is None:
                raise ValueError(f"generative model {model.model_id} has no step cost")
            self.engines[model.model_id] = SimEngine(
                self.config.worker.engine, step, model.n_ctx_total, model.n_seq_max,
                functools.partial(model.cost.jitter, self._rng), model.tpot_target_s,
                model.cost.step_s, model.drafting, self._rng,
                kv_bytes_per_token=model.memory_bytes // max(1, model.n_ctx_total))
        self.loads += 1
        self._resident = frozenset(m.model_id for m in self.residency.models())
        self._view = None
        self.owner.loaded(self.worker_id, model.model_id)

    def _load(self, model: SimModel, now: float) -> bool | None:
        """Start loading ``model``: True (busy for its load time), None (must wait for
        in-use victims), False (it can never fit: its inbox requests failed)."""
        if not self.residency.can_ever_hold(model.memory_bytes):
            mine = [r for r, _ in self.inbox if r.model == model.model_id]
            self.inbox = deque(i for i in self.inbox if i[0].model != model.model_id)
            for r in mine:
                self.owner.ended(r, "failed", now, "too_large")
            self.owner.capacity(now)
            return False
        plan = self.residency.plan_load(model.model_id, model.memory_bytes)
        if plan is None:
            return None
        for victim in plan.victims:
            self.residency.evict(victim)
            self.engines.pop(victim, None)
        self._commit(model, now)
        self._busy_until(now + model.cost.load_s, self._after_load, None)
        return True

    def _after_load(self, now: float, _arg: object) -> None:
        self.busy = False
        self._run(now)

    def _run_batch(self, model: SimModel, batch: list[SimRequest], now: float) -> None:
        for r in batch:
            r.status = "running"
            r.started_s = now
            r.batch_size = len(batch)
        self.residency.acquire(model.model_id, now)
        self.oneshot_active = len(batch)
        self.owner.batch_started(self.worker_id, model.model_id, batch, now)
        longest = max(r.input_chars for r in batch)  # padded to its longest member
        seconds = model.cost.batch_s(len(batch), longest) * model.cost.jitter(self._rng)
        self._busy_until(now + seconds, self._after_batch, (model.model_id, batch, seconds))

    def _after_batch(self, now: float, arg: tuple[str, list[SimRequest], float]) -> None:
        model_id, batch, seconds = arg
        self.busy = False
        self.oneshot_active = 0
        self.residency.release(model_id, now)
        self.owner.batch_done(self.worker_id, model_id, len(batch), seconds)
        for r in batch:
            if r.deadline_s is not None and now >= r.deadline_s:  # never complete late
                self.owner.ended(r, "expired", now, "deadline")
            else:
                r.first_token_s = now
                self.owner.ended(r, "completed", now, None)
        self._view = None
        self.owner.capacity(now)
        self._step_engines(now, did=True)

    def _step_engines(self, now: float, did: bool = False) -> None:
        """One step of every engine with work, back to back. If none ran, the loop goes
        round again when this iteration ``did`` something (a batch ran), else it idles."""
        self._view = None
        steps: list[tuple[SimEngine, StepPlan, float]] = []
        t = now
        for model_id, engine in self.engines.items():
            if not engine.has_work:
                continue
            for r in engine.expire(t):
                self.residency.release(model_id, t)
                self.owner.ended(r, "expired", t, "deadline")
            plan, seconds = engine.start_step(t)
            if plan.chunks:
                t += seconds
                steps.append((engine, plan, t))
            else:
                wake = engine.next_wakeup_s()
                if wake is not None:
                    self._wake_later(wake)
        if steps:
            self._busy_until(t, self._after_steps, steps)
            return
        expiry_s = self.residency.next_expiry_s(after_s=now)
        if expiry_s is not None:
            self._wake_later(expiry_s)
        self.owner.capacity(now)
        if did:
            self._run(now)

    def _after_steps(self, now: float, steps: list[tuple[SimEngine, StepPlan, float]]) -> None:
        self.busy = False
        self._view = None
        for engine, plan, end_s in steps:
            for req, status in engine.end_step(plan, end_s):
                self.residency.release(req.model, end_s)
                self.owner.ended(req, status, end_s, "deadline" if status == "expired" else None)
        self.owner.capacity(now)
        self._run(now)

    # -- helpers ---------------------------------------------------------------------------

    def _busy_until(self, t: float, fn: object, arg: object) -> None:
        self.busy = True
        self.busy_s += t - self.loop.now
        self.loop.at(t, fn, arg)  # type: ignore[arg-type]

    def _wake_later(self, t: float) -> None:
        if self._wake_at is None or t < self._wake_at:
            self._wake_at = t
            self.loop.at(t, self._on_wake)
