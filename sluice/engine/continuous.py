"""Continuous batching for one loaded generative model.

The step loop reads like the design: plan = the pure step planner decides which tokens to
feed (one decode token per running sequence, then prefill chunks, then newly admitted
requests while KV blocks and slots allow; see ``sluice.policy.step_planner``); apply = the
engine starts what it admitted (slot, KV blocks, prefix copy); logits = one ``forward``
call; update = sample, stream, retire. A retiring sequence frees its slot and blocks at
once, so the next waiting request is admitted in the very next plan.

``mode`` selects the baselines we measure against: ``static`` admits only into an empty
engine (waiting up to ``static_max_wait_s`` to fill it) and runs that batch to the end;
``serial`` runs one request at a time.

Owned by one worker thread; nothing here is shared across threads except the requests'
thread-safe state machines.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from sluice.backends.base import ForwardChunk, GenerativeModel
from sluice.engine.request import Request, RequestStatus, TokenEvent
from sluice.engine.sampling import SamplingError, new_rng, sample_token
from sluice.engine.textstream import TextStream
from sluice.policy.kv_blocks import KVBlockAllocator
from sluice.policy.step_planner import (
    Admission,
    BatchingMode,
    EngineConfig,
    RunningSeq,
    StepPlan,
    StepView,
    WaitingSeq,
    plan_step,
    reserve_admission,
    static_wakeup_s,
)

__all__ = ["BatchingMode", "ContinuousEngine", "EngineConfig"]


@dataclass(eq=False)
class _Sequence:
    """A running request bound to a slot: ``tokens`` = prompt + generated so far."""

    req: Request
    slot: int
    tokens: list[int]
    n_prompt: int
    rng: np.random.Generator
    text: TextStream
    n_fed: int = 0
    generated: int = 0

    @property
    def prefilling(self) -> bool:
        return self.n_fed < self.n_prompt

    def view(self) -> RunningSeq:
        return RunningSeq(
            self.slot, self.req.request_id, self.n_prompt, self.n_fed, self.generated, self.tokens
        )


@dataclass
class _Batch:
    """What one forward pass feeds, and which sequence owns each chunk."""

    chunks: list[ForwardChunk] = field(default_factory=list)
    owners: list[_Sequence] = field(default_factory=list)


def _waiting_view(req: Request) -> WaitingSeq:
    since = req.times.started_s or req.arrival_s
    return WaitingSeq(req.request_id, req.prompt_tokens, req.params.max_tokens, since)


class ContinuousEngine:
    """Admits, steps and retires the generative requests of one model."""

    def __init__(
        self,
        model: GenerativeModel,
        config: EngineConfig,
        clock: Callable[[], float],
        on_retire: Callable[[Request], None],
    ) -> None:
        self.model = model
        self.config = config
        self._clock = clock
        self._on_retire = on_retire
        self.kv = KVBlockAllocator.for_context(
            model.n_ctx_total, model.n_seq_max, config.kv_block_tokens, unified=False
        )
        self.waiting: deque[Request] = deque()
        self.running: dict[int, _Sequence] = {}
        self._free_slots = list(range(model.n_seq_max - 1, -1, -1))
        """A stack: ``pop()`` gives slot 0 first; a freed slot is reused first."""
        self.steps = 0
        self.last_batch_size = 0
        self.reused_prefix_tokens = 0
        """Prompt tokens not recomputed thanks to prefix reuse (a counter)."""

    # -- queue ---------------------------------------------------------------------------

    def add(self, req: Request) -> None:
        """Queue a request; one that can never fit in a sequence slot fails at once."""
        need = len(req.prompt_tokens) + req.params.max_tokens
        if self.kv.never_fits(need):
            req.finish(
                RequestStatus.FAILED,
                self._clock(),
                error=f"prompt ({len(req.prompt_tokens)}) + max_tokens "
                f"({req.params.max_tokens}) exceeds {self.kv.max_seq_tokens} tokens per sequence",
                error_code="context_length_exceeded",
            )
            self._on_retire(req)
            return
        self.waiting.append(req)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def active_count(self) -> int:
        return len(self.running)

    def requests(self) -> list[Request]:
        """Every request the engine holds (waiting and running)."""
        return [*self.waiting, *(s.req for s in self.running.values())]

    def next_wakeup_s(self, now: float) -> float | None:
        """Static mode: when the oldest waiting request stops waiting for a full batch."""
        head = _waiting_view(self.waiting[0]) if self.waiting else None
        return static_wakeup_s(self.config, len(self.running), head)

    # -- the step loop -------------------------------------------------------------------

    def step(self) -> bool:
        """One engine step; False when there was nothing to run."""
        now = self._clock()
        self._retire_stopped(now)
        plan = plan_step(self.config, self.view(now))  # decide
        batch = self._apply(plan, now)  # admit, reserve KV, copy prefixes
        if not batch.chunks:
            return False
        logits = self._forward(batch)  # execute
        if logits is not None:
            self._update(batch, logits)  # sample, stream, retire
        return True

    def view(self, now: float) -> StepView:
        """The engine as the step planner sees it (ended requests already swept out)."""
        return StepView(
            running=tuple(seq.view() for seq in self.running.values()),
            waiting=tuple(_waiting_view(req) for req in self.waiting),
            free_slots=tuple(reversed(self._free_slots)),
            kv=self.kv.snapshot(),
            now=now,
        )

    def _apply(self, plan: StepPlan, now: float) -> _Batch:
        """Carry out a plan in its order: start the admitted requests, then pair every
        chunk with its sequence's tokens."""
        not_started = self._start(plan.admissions, now)
        batch = _Batch()
        for chunk in plan.chunks:
            if chunk.slot in not_started:
                continue
            seq = self.running[chunk.slot]
            tokens = tuple(seq.tokens[chunk.start_pos : chunk.start_pos + chunk.n_tokens])
            batch.chunks.append(
                ForwardChunk(chunk.slot, tokens, chunk.start_pos, chunk.want_logits)
            )
            batch.owners.append(seq)
        self.last_batch_size = len(batch.chunks)
        return batch

    def _start(self, admissions: tuple[Admission, ...], now: float) -> set[int]:
        """Start admitted requests in plan order: take the slot, reserve its KV blocks,
        forget the slot's old KV, copy a shared prefix. Returns the slots left unstarted.

        A request cancelled or ended by another thread since the plan was made stays in the
        line, where the next step's sweep ends it properly; the admissions after it wait
        for the next plan too, since this plan counted on its slot and prefix."""
        for i, adm in enumerate(admissions):
            index = self._waiting_index(adm.request_id)
            req = self.waiting[index]
            if not req.mark_running(now):
                return {a.slot for a in admissions[i:]}
            del self.waiting[index]
            self._free_slots.remove(adm.slot)
            reserve_admission(self.kv, adm)
            self.model.release_sequence(adm.slot)
            seed = req.params.seed if req.params.seed is not None else req.request_id
            seq = _Sequence(
                req=req,
                slot=adm.slot,
                tokens=list(req.prompt_tokens),
                n_prompt=len(req.prompt_tokens),
                rng=new_rng(seed),
                text=TextStream(req.params.stop),
            )
            self.running[adm.slot] = seq
            if adm.prefix is not None:
                self.model.copy_sequence(adm.prefix.donor_slot, adm.slot, adm.prefix.n_tokens)
                seq.n_fed = adm.prefix.n_tokens
                self.reused_prefix_tokens += adm.prefix.n_tokens
        return set()

    def _waiting_index(self, request_id: int) -> int:
        # Admissions come from the head of the line, so this is almost always index 0.
        for index, req in enumerate(self.waiting):
            if req.request_id == request_id:
                return index
        raise RuntimeError(f"plan admits request {request_id}, which is not waiting")

    def _forward(self, batch: _Batch) -> np.ndarray | None:
        """One forward pass; a backend fault fails that batch's requests (``None``)."""
        try:
            return self.model.forward(batch.chunks)
        except Exception as exc:  # the worker must outlive any backend fault
            self._fail(batch, exc)
            return None

    def _update(self, batch: _Batch, logits: np.ndarray) -> None:
        now = self._clock()
        self.steps += 1
        row = 0
        for chunk, seq in zip(batch.chunks, batch.owners, strict=True):
            seq.n_fed += len(chunk.tokens)
            if not chunk.want_logits:
                continue
            row += 1
            try:
                token = sample_token(logits[row - 1], seq.req.params, seq.rng)
            except SamplingError as exc:  # this request's distribution: it alone fails
                self._retire(seq, RequestStatus.FAILED, now, error=str(exc),
                             error_code="internal_error")
                continue
            self._accept(seq, token, now)

    def _accept(self, seq: _Sequence, token: int, now: float) -> None:
        params = seq.req.params
        deadline = seq.req.deadline_s
        if deadline is not None and now >= deadline:
            # The pass ended past the deadline: its token is not delivered, so a request
            # either completes in time or ends expired, never completes late.
            self._retire(seq, RequestStatus.EXPIRED, now, error="deadline passed while running",
                         error_code="deadline")
            return
        if token in self.model.eos_token_ids and not params.ignore_eos:
            self._retire(seq, RequestStatus.COMPLETED, now, finish_reason="stop")
            return
        seq.tokens.append(token)
        index = seq.generated
        seq.generated += 1
        delta = seq.text.push(self.model.token_bytes(token))
        seq.req.emit_token(TokenEvent(index=index, token_id=token, text=delta, time_s=now))
        if seq.text.stopped:
            self._retire(seq, RequestStatus.COMPLETED, now, finish_reason="stop")
        elif seq.generated >= params.max_tokens:
            self._retire(seq, RequestStatus.COMPLETED, now, finish_reason="length")

    def _retire_stopped(self, now: float) -> None:
        """Cancelled, expired or already-ended requests leave before the next pass."""
        for seq in list(self.running.values()):
            req = seq.req
            if req.is_terminal:
                self._retire(seq, req.status, now)
            elif req.cancel_requested:
                self._retire(seq, RequestStatus.CANCELLED, now, error="cancelled by client")
            elif req.deadline_s is not None and now >= req.deadline_s:
                self._retire(
                    seq, RequestStatus.EXPIRED, now, error="deadline passed while running",
                    error_code="deadline",
                )
        keep: deque[Request] = deque()
        for req in self.waiting:
            if req.cancel_requested:
                req.finish(RequestStatus.CANCELLED, now, error="cancelled by client")
            elif req.deadline_s is not None and now >= req.deadline_s:
                req.finish(
                    RequestStatus.EXPIRED, now, error="deadline passed while waiting for KV",
                    error_code="deadline",
                )
            if req.is_terminal:
                self._on_retire(req)
            else:
                keep.append(req)
        self.waiting = keep

    def _retire(self, seq: _Sequence, status: RequestStatus, now: float, **final: object) -> None:
        self.running.pop(seq.slot, None)
        self.model.release_sequence(seq.slot)
        self.kv.free(seq.slot)
        self._free_slots.append(seq.slot)
        if status.is_terminal and not seq.req.is_terminal:
            tail = seq.text.flush()
            if tail:
                seq.req.emit_token(
                    TokenEvent(index=seq.generated - 1, token_id=-1, text=tail, time_s=now)
                )
            seq.req.finish(status, now, text=seq.text.text, **final)
        self._on_retire(seq.req)

    def _fail(self, batch: _Batch, exc: Exception) -> None:
        now = self._clock()
        for seq in {id(s): s for s in batch.owners}.values():
            self._retire(
                seq, RequestStatus.FAILED, now, error=f"backend error: {exc}",
                error_code="backend_error",
            )

    def abort_all(self, now: float, error: str) -> None:
        """Cancel everything (shutdown)."""
        for req in self.requests():
            req.finish(RequestStatus.CANCELLED, now, error=error, error_code="shutdown")
        self._retire_stopped(now)

