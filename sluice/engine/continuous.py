"""Continuous batching for one loaded generative model.

The step loop reads like the design: plan = decide which tokens to feed (one decode
token per running sequence, then prefill chunks, then newly admitted requests while KV
blocks and slots allow); logits = one ``forward`` call; update = sample, stream, retire.
A retiring sequence frees its slot and blocks at once, so the next waiting request is
admitted in the very next plan.

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
from typing import Literal

import numpy as np

from sluice.backends.base import ForwardChunk, GenerativeModel
from sluice.engine.request import Request, RequestStatus, TokenEvent
from sluice.engine.sampling import sample_token
from sluice.engine.textstream import TextStream
from sluice.policy.kv_blocks import KVBlockAllocator

BatchingMode = Literal["continuous", "static", "serial"]


@dataclass(frozen=True)
class EngineConfig:
    """How a generative model's engine batches."""

    mode: BatchingMode = "continuous"
    """``continuous`` (default), ``static`` or ``serial`` (baselines)."""
    max_batch_tokens: int = 512
    """Tokens fed in one forward pass (decode tokens + prefill chunks)."""
    prefill_chunk_tokens: int = 256
    """Longest prefill piece of one prompt in one pass (chunked prefill)."""
    kv_block_tokens: int = 16
    """KV block size for admission accounting."""
    static_max_wait_s: float = 0.05
    """Static mode: how long to wait for a full batch."""
    prefix_reuse: bool = True
    """Copy the KV of a shared prompt prefix from a running sequence instead of
    recomputing it."""
    min_prefix_tokens: int = 16
    """Shortest shared prefix worth copying."""

    def __post_init__(self) -> None:
        for name in ("max_batch_tokens", "prefill_chunk_tokens", "kv_block_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"engine.{name} must be >= 1, got {getattr(self, name)}")
        if self.mode not in ("continuous", "static", "serial"):
            raise ValueError(f"engine.mode must be continuous|static|serial, got {self.mode!r}")


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


@dataclass
class StepPlan:
    """What one forward pass feeds, and which sequence owns each chunk."""

    chunks: list[ForwardChunk] = field(default_factory=list)
    owners: list[_Sequence] = field(default_factory=list)


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
        if self.config.mode != "static" or self.running or not self.waiting:
            return None
        started = self.waiting[0].times.started_s or self.waiting[0].arrival_s
        return started + self.config.static_max_wait_s

    # -- the step loop -------------------------------------------------------------------

    def step(self) -> bool:
        """One engine step; False when there was nothing to run."""
        now = self._clock()
        self._retire_stopped(now)
        plan = self._schedule(now)
        if not plan.chunks:
            return False
        try:
            logits = self.model.forward(plan.chunks)
        except Exception as exc:  # the worker must outlive any backend fault
            self._fail(plan, exc)
            return True
        self._update(plan, logits)
        return True

    def _schedule(self, now: float) -> StepPlan:
        plan = StepPlan()
        budget = self.config.max_batch_tokens
        for seq in self.running.values():
            if not seq.prefilling and budget > 0:
                self._add_chunk(plan, seq, [seq.tokens[-1]])
                budget -= 1
        for seq in self.running.values():
            if seq.prefilling and budget > 0:
                budget -= self._add_prefill(plan, seq, budget)
        for _ in range(self._admit_limit(now)):
            admitted = self._admit(now) if budget > 0 else None
            if admitted is None:
                break
            budget -= self._add_prefill(plan, admitted, budget)
        self.last_batch_size = len(plan.chunks)
        return plan

    def _admit_limit(self, now: float) -> int:
        """How many waiting requests this plan may admit, by batching mode."""
        if not self.waiting or not self._free_slots:
            return 0
        if self.config.mode == "continuous":
            return len(self._free_slots)
        if self.running:
            return 0  # static and serial admit only into an empty engine
        if self.config.mode == "serial":
            return 1
        wake = self.next_wakeup_s(now)
        full = len(self.waiting) >= self.model.n_seq_max
        return len(self._free_slots) if full or wake is None or now >= wake else 0

    def _admit(self, now: float) -> _Sequence | None:
        while self.waiting and self.waiting[0].is_terminal:
            self._on_retire(self.waiting.popleft())
        if not self.waiting:
            return None
        req = self.waiting[0]
        need = len(req.prompt_tokens) + req.params.max_tokens
        if not self.kv.can_allocate(need):
            return None  # head-of-line waits for blocks; order is kept
        self.waiting.popleft()
        if not req.mark_running(now):
            self._on_retire(req)
            return self._admit(now)
        slot = self._free_slots.pop()
        self.kv.allocate(slot, need)
        self.model.release_sequence(slot)
        seed = req.params.seed if req.params.seed is not None else req.request_id
        seq = _Sequence(
            req=req,
            slot=slot,
            tokens=list(req.prompt_tokens),
            n_prompt=len(req.prompt_tokens),
            rng=np.random.default_rng(seed),
            text=TextStream(req.params.stop),
        )
        self.running[slot] = seq
        if self.config.prefix_reuse:
            self._reuse_prefix(seq)
        return seq

    def _reuse_prefix(self, seq: _Sequence) -> None:
        """Start ``seq`` after the longest prompt prefix some running sequence has already
        fed, copying that KV (at least one prompt token is left to feed for logits)."""
        best_len, donor = 0, None
        limit = seq.n_prompt - 1
        for other in self.running.values():
            if other is seq:
                continue
            n = _common_prefix(seq.tokens, other.tokens, min(limit, other.n_fed))
            if n > best_len:
                best_len, donor = n, other
        if donor is None or best_len < self.config.min_prefix_tokens:
            return
        self.model.copy_sequence(donor.slot, seq.slot, best_len)
        seq.n_fed = best_len
        self.reused_prefix_tokens += best_len

    def _add_prefill(self, plan: StepPlan, seq: _Sequence, budget: int) -> int:
        take = min(seq.n_prompt - seq.n_fed, self.config.prefill_chunk_tokens, budget)
        if take <= 0:
            return 0
        self._add_chunk(plan, seq, seq.tokens[seq.n_fed : seq.n_fed + take])
        return take

    @staticmethod
    def _add_chunk(plan: StepPlan, seq: _Sequence, tokens: list[int]) -> None:
        done_prefill = seq.n_fed + len(tokens) >= seq.n_prompt
        plan.chunks.append(ForwardChunk(seq.slot, tuple(tokens), seq.n_fed, done_prefill))
        plan.owners.append(seq)

    def _update(self, plan: StepPlan, logits: np.ndarray) -> None:
        now = self._clock()
        self.steps += 1
        row = 0
        for chunk, seq in zip(plan.chunks, plan.owners, strict=True):
            seq.n_fed += len(chunk.tokens)
            if not chunk.want_logits:
                continue
            token = sample_token(logits[row], seq.req.params, seq.rng)
            row += 1
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

    def _fail(self, plan: StepPlan, exc: Exception) -> None:
        now = self._clock()
        for seq in {id(s): s for s in plan.owners}.values():
            self._retire(
                seq, RequestStatus.FAILED, now, error=f"backend error: {exc}",
                error_code="backend_error",
            )

    def abort_all(self, now: float, error: str) -> None:
        """Cancel everything (shutdown)."""
        for req in self.requests():
            req.finish(RequestStatus.CANCELLED, now, error=error, error_code="shutdown")
        self._retire_stopped(now)


def _common_prefix(a: list[int], b: list[int], limit: int) -> int:
    """Length of the common prefix of ``a`` and ``b``, at most ``limit``."""
    n = 0
    for x, y in zip(a[:limit], b[:limit], strict=False):
        if x != y:
            break
        n += 1
    return n
