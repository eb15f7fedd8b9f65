"""Continuous batching for one loaded generative model.

The step loop reads like the design: plan = the pure step planner decides which tokens to
feed (one decode token per running sequence, then prefill chunks, then newly admitted
requests while KV blocks and slots allow; see ``sluice.policy.step.step_planner``); apply = the
engine starts what it admitted (slots, KV blocks, prefix copy); logits = one ``forward``
call; update = fork, choose, stream, retire. A retiring sequence frees its slot and blocks
at once, so the next waiting request is admitted in the very next plan.

Slots: ``self.slots`` (``sluice.policy.step.slot_table``, the simulator's too) applies the
plan's admissions and every retirement and move to its free, retained, running and held
slots and the KV allocator, and returns what the model's KV must do (clear, trim, copy).
Retained prefixes (``engine.retain_prefixes``): a choice that completes leaves its KV in
its idle slot with its blocks returned to the allocator. The planner sees those slots as
donors and as slots to hand out when none is free; the engine then trims a slot kept in
place, or clears one handed out or evicted for KV room. Invariant: a slot is exactly one
of free, retained or holding a sequence (or a fork slot of a started request); a retained
slot's model KV is the tokens the table keeps for it.

A request is a ``_Group`` of ``n`` choices, each a ``_Sequence`` in its own slot. Choice 0
prefills; when its prefill ends the group forks (``_fork``): the prompt's KV is copied into
the slots the admission held, and every choice draws its first token from the one logits
row. The request ends (one ``Final``, with ``choices`` when ``n`` > 1) when its last choice
does; a cancel, a deadline or a failure ends every choice at once.

Token choice (``sluice.engine.chooser``): log-sum-exps, bias and penalties vectorised over
the step's rows, then per sequence the grammar mask, sampling and log-probabilities. The
crash barrier: everything one request does alone (starting its choosers and grammar,
prompt log-probabilities, choosing, accepting, detokenizing) runs in ``_barrier``, so an
exception there fails that request alone; a fault in the shared forward pass fails that
pass's requests.

``mode`` selects the baselines we measure against: ``static`` admits only into an empty
engine (waiting up to ``static_max_wait_s`` to fill it) and runs that batch to the end;
``serial`` runs one request at a time.

``ContinuousEngine`` is composed of one mixin per concern, each in its own module over the
fields ``state.EngineState`` declares (with the request's ``_Group``, its ``_Sequence``
choices and one pass's ``_Batch``): ``arrivals`` (the checks at ``add``, the TTFT
prediction and its refusal, the waiting line's order), ``slot_moves`` (starting admitted
requests in their slots, prefix trims and copies, compaction moves, the ``/slots``
operations), ``step_loop`` (the step, its budget, its view, the apply and the pass, and
learning the step time), ``token_path`` (forks, choosing and accepting tokens, verified
drafts) and ``retirement`` (finishing choices, ending requests with their one ``Final``,
the sweep before each pass, the crash barrier).

Owned by one worker thread; nothing here is shared across threads except the requests'
thread-safe state machines.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable
from pathlib import Path

from sluice.backends.base import GenerativeModel, ModelLoadError
from sluice.engine.continuous.state import (
    SlotHolding,
    SlotState,
    _Group,
    _Sequence,
    _waiting_view,
)
from sluice.engine.continuous.step_loop import StepLoop
from sluice.engine.request import Request
from sluice.engine.speculation import SpeculationState
from sluice.engine.step_times import StepTimes
from sluice.engine.step_warmup import measure_step_cost
from sluice.policy.step.prompt_cache import PromptCache, prompt_cache_for
from sluice.policy.step.slot_table import SlotTable
from sluice.policy.step.speculation import DraftGate
from sluice.policy.step.step_cost import DEFAULT_STEP_COST, OnlineStepCost, StepCost
from sluice.policy.step.step_data import BatchingMode, EngineConfig
from sluice.policy.step.step_planner import static_wakeup_s
from sluice.policy.step.tpot_margin import TpotMargin

STEP_COST_WINDOW = 192
"""Steps the step-time model is fitted on (about 25 s of 130 ms steps): a host that slows
down (other jobs on its cores) is followed within seconds, not minutes."""

__all__ = ["BatchingMode", "ContinuousEngine", "EngineConfig", "SlotHolding", "SlotState"]


class ContinuousEngine(StepLoop):
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
        self.slots = SlotTable.for_context(config, model.n_ctx_total, model.n_seq_max,
                                           unified=model.kv_unified)
        self.kv = self.slots.kv
        self.waiting: deque[Request] = deque()
        self.running: dict[int, _Sequence] = {}
        self._groups: dict[int, _Group] = {}
        self.steps = 0
        self._last_step_end_s = None
        self.last_batch_size = 0
        self.reused_prefix_tokens = 0
        self.retained_prefix_tokens = 0
        self.forked_prompt_tokens = 0
        self.slot_moves = 0
        self.prompt_cache: PromptCache[bytes] | None = prompt_cache_for(
            config, unified=model.kv_unified)
        self.step_cost = OnlineStepCost(_step_cost_prior(model),
                                        window=STEP_COST_WINDOW, refit_every=16)
        self.tpot_margin = TpotMargin()
        self.step_times = StepTimes()
        self.tpot_target_s = model.spec.tpot_target_s
        self.width = None
        self.drafting = model.spec.speculation == "auto" and config.mode == "continuous"
        self.speculation = SpeculationState(model.spec.speculation)
        self.draft_gate = DraftGate()

    @property
    def active_count(self) -> int:
        return len(self.running)

    def speculation_state(self) -> SpeculationState:
        """Its drafting counters with its draft gate's measurements, as a value for the
        worker's published state."""
        return dataclasses.replace(self.speculation, draft_gate=self.draft_gate.state())

    def next_wakeup_s(self, now: float) -> float | None:
        """Static mode: when the oldest waiting request stops waiting for a full batch."""
        head = _waiting_view(self.waiting[0]) if self.waiting else None
        return static_wakeup_s(self.config, len(self.running), head)


def _step_cost_prior(model: GenerativeModel) -> StepCost:
    """The profiled step-time model the spec names, else one measured by a warm-up of real
    steps when the spec asks for it, else the rough default."""
    path = model.spec.step_cost_path
    if path is None:
        return (measure_step_cost(model, DEFAULT_STEP_COST) if model.spec.step_cost_warmup
                else DEFAULT_STEP_COST)
    try:
        return StepCost.load(Path(path).expanduser())
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"step_cost_file {path}: {exc}") from exc
