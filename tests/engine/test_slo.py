"""The engine under a TPOT target: concurrency follows the step-time model, which it learns
from the steps it runs (synthetic model, a clock that the forward pass advances)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sluice.backends.base import ForwardChunk, ModelLoadError, ModelSpec
from sluice.backends.synthetic import SyntheticGenerative
from sluice.engine.continuous import ContinuousEngine, EngineConfig
from sluice.engine.request import Request, RequestStatus, SamplingParams, TokenEvent
from sluice.policy.step.step_cost import DEFAULT_STEP_COST, StepCost
from sluice.policy.step.step_data import TOKENS_ONLY
from sluice.policy.step.tpot_budget import TpotBudget

_ids = itertools.count(1)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TimedModel(SyntheticGenerative):
    """A synthetic model whose forward pass takes ``base_s + per_decode_s`` per decode +
    ``per_prefill_s`` per prompt token on the shared fake clock."""

    def __init__(self, spec: ModelSpec, clock: Clock, base_s: float, per_decode_s: float,
                 per_prefill_s: float) -> None:
        super().__init__(spec)
        self.clock, self.base_s = clock, base_s
        self.per_decode_s, self.per_prefill_s = per_decode_s, per_prefill_s
        self.batch_sizes: list[int] = []

    def forward(self, chunks: Sequence[ForwardChunk]) -> np.ndarray:
        decodes = sum(1 for c in chunks if len(c.tokens) == 1)
        prefill = sum(len(c.tokens) for c in chunks if len(c.tokens) > 1)
        self.clock.now += self.base_s + self.per_decode_s * decodes + self.per_prefill_s * prefill
        self.batch_sizes.append(decodes)
        return super().forward(chunks)


def spec(**fields: Any) -> ModelSpec:
    options = {"speed_scale": 0.0, "n_seq_max": 16, "n_ctx_per_seq": 64, "kv_unified": True}
    return ModelSpec("chat", "generative", "synthetic", 1, options=options, **fields)


def request(n_prompt: int = 4, max_tokens: int = 12) -> Request:
    req = Request(
        request_id=next(_ids), model_id="chat", kind="generative", arrival_s=0.0,
        prompt_tokens=tuple(range(10, 10 + n_prompt)),
        params=SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
    )
    req.token_times = []  # type: ignore[attr-defined]
    req.listeners.append(lambda e: isinstance(e, TokenEvent) and e.token_id >= 0
                         and req.token_times.append(e.time_s))  # type: ignore[attr-defined]
    req.mark_queued(0.0)
    return req


def build(model_spec: ModelSpec, per_decode_s: float = 0.010
          ) -> tuple[ContinuousEngine, TimedModel, list[Request]]:
    clock = Clock()
    m = TimedModel(model_spec, clock, base_s=0.002, per_decode_s=per_decode_s,
                   per_prefill_s=0.0001)
    retired: list[Request] = []
    eng = ContinuousEngine(m, EngineConfig(kv_block_tokens=8), clock, retired.append)
    return eng, m, retired


def run(eng: ContinuousEngine, limit: int = 5000) -> None:
    for _ in range(limit):
        if not eng.has_work:
            return
        eng.step()
    raise AssertionError("engine did not finish")


def test_a_unified_pool_lets_one_sequence_use_the_whole_context() -> None:
    eng, m, _ = build(spec())
    assert m.n_ctx_per_seq == m.n_ctx_total == 16 * 64
    assert eng.kv.max_seq_tokens == m.n_ctx_total


def test_without_a_target_every_slot_decodes_at_once() -> None:
    eng, m, retired = build(spec())
    assert eng.budget() is TOKENS_ONLY
    for _ in range(12):
        eng.add(request())
    run(eng)
    assert len(retired) == 12 and max(m.batch_sizes) == 12


def test_the_tpot_target_bounds_the_sequences_decoding_at_once(tmp_path: Path) -> None:
    # Profiled prior: 2 ms + 10 ms per decode. Target 60 ms at margin 0.85 = 51 ms: at
    # most 4 decodes (42 ms); a fifth would be 52 ms.
    prior = tmp_path / "cost.json"
    StepCost(0.002, 0.010, 0.0001).save(prior)
    eng, m, _ = build(spec(tpot_target_s=0.060, step_cost_path=str(prior)))
    assert isinstance(eng.budget(), TpotBudget)
    reqs = [request() for _ in range(12)]
    for r in reqs:
        eng.add(r)
    run(eng)
    assert all(r.status == RequestStatus.COMPLETED for r in reqs)
    assert max(m.batch_sizes) == 4
    for r in reqs:  # every request's time per output token met the target
        assert r.final is not None
        gaps = np.diff(r.token_times)  # type: ignore[attr-defined]
        assert gaps.max() <= 0.060


def test_the_step_model_is_learned_from_measured_steps() -> None:
    # The prior (3 ms per decode) is wrong: the machine takes 10 ms per decode. Under a
    # 60 ms target the prior would let 16 decode at once; the learned model brings it
    # back to 4 within a few refits.
    eng, m, _ = build(spec(tpot_target_s=0.060))
    assert eng.step_cost.current() == DEFAULT_STEP_COST
    for _ in range(3):
        for _ in range(16):
            eng.add(request(max_tokens=30))
        run(eng)
    learned = eng.step_cost.current()
    # what it measured (steps of 4: 42 ms) it predicts; a fifth would break 51 ms
    assert learned.predict_s(4) == pytest.approx(0.042, rel=0.05)
    assert max(m.batch_sizes[-40:]) == 4


def test_a_bad_step_cost_file_fails_the_load_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "cost.json"
    bad.write_text("{}")
    with pytest.raises(ModelLoadError, match="step_cost_file"):
        build(spec(step_cost_path=str(bad)))
    with pytest.raises(ModelLoadError, match="step_cost_file"):
        build(replace(spec(), step_cost_path=str(tmp_path / "missing.json")))


# -- first-token deadlines --------------------------------------------------------------


def with_ttft(req: Request, ttft_deadline_s: float) -> Request:
    req.ttft_deadline_s = ttft_deadline_s
    return req


def test_a_request_predicted_to_miss_its_first_token_deadline_is_refused_at_once(
        tmp_path: Path) -> None:
    # 2 ms + 10 ms per decode under 60 ms: 4 run at once within the budget (0.85 x 60 ms),
    # 5 within the target itself (the prior is exact here).
    prior = tmp_path / "cost.json"
    StepCost(0.002, 0.010, 0.0001).save(prior)
    eng, _, retired = build(spec(tpot_target_s=0.060, step_cost_path=str(prior)))
    busy = [request(max_tokens=40) for _ in range(5)]
    for r in busy:
        eng.add(r)
    eng.step()  # four start, the fifth waits (no first-token target: no widening)
    # Widening to 5 starts the fifth at once but leaves no slot within the TPOT target;
    # a slot frees after 40 more steps (~1.7 s): a 1 s first-token deadline cannot be
    # met, a 3 s one can.
    late = with_ttft(request(), eng._clock() + 1.0)
    eng.add(late)
    assert late.status == RequestStatus.REJECTED and late in retired
    assert late.final is not None and late.final.error_code == "deadline_infeasible"
    assert late.final.retry_after_s is not None and late.final.retry_after_s >= 0.5
    assert "first-token deadline infeasible" in (late.final.error or "")
    ok = with_ttft(request(), eng._clock() + 3.0)
    eng.add(ok)
    assert ok.status == RequestStatus.QUEUED
    run(eng)
    assert ok.status == RequestStatus.COMPLETED
    assert ok.times.first_token_s is not None and ok.times.first_token_s <= 3.0


def test_no_request_waits_past_its_first_token_deadline_unanswered(tmp_path: Path) -> None:
    # The prior says 1 ms per decode, the machine takes 10: predictions let requests in
    # that then cannot start in time; they end at their deadline, not later.
    prior = tmp_path / "cost.json"
    StepCost(0.0, 0.001, 0.00001).save(prior)
    eng, _, _ = build(spec(tpot_target_s=0.060, step_cost_path=str(prior)))
    eng.step_cost = type(eng.step_cost)(StepCost(0.0, 0.001, 0.00001), min_samples=10**6)
    reqs = [with_ttft(request(max_tokens=30), 0.5) for _ in range(40)]
    for r in reqs:
        eng.add(r)
    run(eng)
    for r in reqs:
        assert r.final is not None
        if r.times.first_token_s is not None:
            assert r.times.first_token_s <= 0.5 + 1e-9
        else:
            assert r.status in (RequestStatus.EXPIRED, RequestStatus.REJECTED)
            assert r.times.finished_s is not None
            # answered by the first step that ended past its deadline (a step: <= 0.2 s)
            assert r.times.finished_s <= 0.5 + 0.2
    assert any(r.status == RequestStatus.EXPIRED for r in reqs)
    assert any(r.status == RequestStatus.COMPLETED for r in reqs)


# -- when the KV pool runs out: wait, never preempt ----------------------------------------


def test_a_full_kv_pool_makes_requests_wait_and_never_preempts_a_running_one() -> None:
    # A unified pool of 8 x 32 = 256 tokens (32 blocks of 8); each choice reserves its
    # prompt + max_tokens = 4 + 44 = 48 tokens (6 blocks): 5 choices fit at once, 8 slots.
    model_spec = ModelSpec("chat", "generative", "synthetic", 1, options={
        "speed_scale": 0.0, "n_seq_max": 8, "n_ctx_per_seq": 32, "kv_unified": True})
    eng, _, retired = build(model_spec)
    steps_of: dict[int, list[int]] = {}
    reqs = []
    for i in range(10):
        req = request(max_tokens=44)
        if i % 3 == 1:
            req.params = SamplingParams(max_tokens=44, temperature=0.8, ignore_eos=True, n=2)
        req.listeners.append(lambda e, rid=req.request_id: isinstance(e, TokenEvent)
                             and e.choice == 0 and e.token_id >= 0
                             and steps_of.setdefault(rid, []).append(eng.steps))
        reqs.append(req)
        eng.add(req)
    held_back_kv = 0
    while eng.has_work:
        plan_view = eng.view(eng._clock())
        used = eng.kv.used_blocks
        assert used <= eng.kv.total_blocks
        if plan_view.waiting and plan_view.free_slots and not eng.kv.can_allocate(48):
            held_back_kv += 1
        eng.step()
        eng.kv.check_integrity()
    assert held_back_kv > 0  # the pool, not the slots, was what made requests wait
    assert all(r.status == RequestStatus.COMPLETED for r in reqs) and len(retired) == 10
    for r in reqs:
        assert r.final is not None and r.final.completion_tokens == 44 * r.params.n
        steps = steps_of[r.request_id]
        # once started, a token every step until done: never preempted, never paused
        assert steps == list(range(steps[0], steps[0] + 44))
    assert eng.kv.free_blocks == eng.kv.total_blocks


# -- the waiting line in the scheduler's order ---------------------------------------------


def test_priority_deadline_line_order_starts_the_most_urgent_first() -> None:
    clock = Clock()
    one_slot = ModelSpec("chat", "generative", "synthetic", 1, options={
        "speed_scale": 0.0, "n_seq_max": 1, "n_ctx_per_seq": 64})
    m = TimedModel(one_slot, clock, base_s=0.002, per_decode_s=0.010, per_prefill_s=0.0001)
    # one sequence at a time: the line order is the start order
    eng = ContinuousEngine(m, EngineConfig(kv_block_tokens=8, line_order="priority_deadline"),
                           clock, lambda r: None)
    started: list[str] = []

    def make(name: str, priority: int, start_by: float | None) -> Request:
        req = request(max_tokens=3)
        req.priority = priority
        req.ttft_deadline_s = start_by
        req.listeners.append(lambda e: isinstance(e, TokenEvent) and e.index == 0
                             and started.append(name))
        return req

    for name, prio, start_by in (("first", 5, None), ("late-5", 5, 50.0), ("none-5", 5, None),
                                 ("soon-5", 5, 10.0), ("urgent-0", 0, None)):
        eng.add(make(name, prio, start_by))
    assert [r.priority for r in eng.waiting][:1] == [0]
    run(eng)
    assert started == ["urgent-0", "soon-5", "late-5", "first", "none-5"]


def test_arrival_line_order_keeps_the_dispatch_order() -> None:
    eng, _, _ = build(spec())
    reqs = [request() for _ in range(3)]
    reqs[2].priority = 0
    for r in reqs:
        eng.add(r)
    assert list(eng.waiting) == reqs


def test_a_bad_line_order_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="line_order"):
        EngineConfig(line_order="random")  # type: ignore[arg-type]


def test_the_step_model_counts_the_time_between_steps() -> None:
    # The worker spends 5 ms between steps (its inbox, its state): a running sequence
    # waits that too, so the learned decode step includes it; an idle gap does not count.
    eng, m, _ = build(spec())
    for wave in range(3):
        for i in range(8):
            eng.add(request(max_tokens=10 + 5 * i))  # 8 decoding, then fewer and fewer
        while eng.has_work:
            eng.step()
            m.clock.now += 0.005
        m.clock.now += 100.0 * (wave + 1)  # idle
    learned = eng.step_cost.current()
    for n in (2, 4, 8):  # within 5 %: the refit's pull towards the prior (10 ms base)
        assert learned.predict_s(n) == pytest.approx(0.002 + n * 0.010 + 0.005, rel=0.05)
        assert learned.predict_s(n) > 0.002 + n * 0.010 + 0.0025  # the gap counted


def test_a_host_that_slows_down_is_followed_within_the_window() -> None:
    eng, m, _ = build(spec(tpot_target_s=0.200))

    def wave() -> None:
        for i in range(8):
            eng.add(request(max_tokens=10 + 5 * i))
        run(eng)

    for _ in range(4):
        wave()
    assert eng.step_cost.current().predict_s(8) == pytest.approx(0.082, rel=0.05)
    m.per_decode_s = 0.020  # other jobs take half the cores
    for _ in range(6):  # 270 steps: more than the window
        wave()
    assert eng.step_cost.current().predict_s(8) == pytest.approx(0.162, rel=0.05)


# -- first-token targets: the TPOT target soft while the line would miss them -----------


def with_target(req: Request, ttft_target_s: float) -> Request:
    req.ttft_target_s = ttft_target_s
    return req


def test_a_line_past_its_first_token_target_widens_the_batch_and_refuses_the_rest(
        tmp_path: Path) -> None:
    """60 ms target, 2 ms + 10 ms a decode: 4 decode within the budget (51 ms), 5 within
    the target. Six requests wanting a first token within 0.5 s: the fifth is started by
    widening to 5; the sixth, which even 5 wide would start only when a slot frees
    (~1.7 s), is refused at once with a Retry-After; nobody is ended for lateness."""
    prior = tmp_path / "cost.json"
    StepCost(0.002, 0.010, 0.0001).save(prior)
    eng, model, retired = build(spec(tpot_target_s=0.060, step_cost_path=str(prior)))
    reqs = [with_target(request(max_tokens=40), 0.5) for _ in range(6)]
    for r in reqs:
        eng.add(r)
    late = reqs[5]
    assert late.status == RequestStatus.REJECTED and late in retired
    assert late.final is not None and late.final.error_code == "deadline_infeasible"
    assert "first-token target infeasible" in (late.final.error or "")
    assert late.final.retry_after_s is not None and late.final.retry_after_s >= 1.0
    eng.step()
    assert len(eng.running) == 5
    assert eng.width is not None and (eng.width.concurrency, eng.width.reason) == (5, "ttft")
    assert eng.width.tpot_concurrency == 4
    run(eng)
    assert all(r.status == RequestStatus.COMPLETED for r in reqs[:5])
    assert max(model.batch_sizes) == 5


def test_an_idle_engine_serves_a_request_its_target_cannot_be_met_for(
        tmp_path: Path) -> None:
    """A host slower than the first-token target (a first token in ~16 ms against a 5 ms
    target): alone, the request is served late rather than refused (refusing protects no
    one); the same request behind another is refused, and so is one whose deadline (a
    client's, not the soft target) cannot be met even alone."""
    prior = tmp_path / "cost.json"
    StepCost(0.002, 0.010, 0.0001).save(prior)
    eng, _, retired = build(spec(tpot_target_s=0.060, step_cost_path=str(prior)))
    alone = with_target(request(n_prompt=40, max_tokens=4), 0.005)
    eng.add(alone)
    assert alone.status != RequestStatus.REJECTED
    behind = with_target(request(n_prompt=40, max_tokens=4), 0.005)
    eng.add(behind)
    assert behind.status == RequestStatus.REJECTED and behind in retired
    run(eng)
    assert alone.status == RequestStatus.COMPLETED
    hard = request(n_prompt=40, max_tokens=4)
    hard.ttft_deadline_s = eng._clock() + 0.005
    eng.add(hard)
    assert hard.status == RequestStatus.REJECTED
    assert hard.final is not None and "first-token deadline" in (hard.final.error or "")


def test_without_first_token_targets_the_budget_alone_decides(tmp_path: Path) -> None:
    prior = tmp_path / "cost.json"
    StepCost(0.002, 0.010, 0.0001).save(prior)
    eng, model, _ = build(spec(tpot_target_s=0.060, step_cost_path=str(prior)))
    reqs = [request(max_tokens=40) for _ in range(6)]
    for r in reqs:
        eng.add(r)
    run(eng)
    assert all(r.status == RequestStatus.COMPLETED for r in reqs)
    assert max(model.batch_sizes) == 4
    assert eng.width is not None and eng.width.reason == "tpot"


def test_the_simulator_and_the_engine_make_the_same_width_decisions(tmp_path: Path) -> None:
    """One arrival pattern (bursts with and without first-token targets) on the engine
    (a timed synthetic model) and on ``SimEngine`` with the same step cost: every step
    the same width, the same reason, the same sequences running, the same refusals."""
    from sluice.sim.engine import SimEngine
    from sluice.sim.request import SimRequest

    cost = StepCost(0.002, 0.010, 0.0001)
    prior = tmp_path / "cost.json"
    cost.save(prior)
    streams = replace(spec(tpot_target_s=0.060, step_cost_path=str(prior)),
                      options={"speed_scale": 0.0, "n_seq_max": 16, "n_ctx_per_seq": 64,
                               "kv_unified": False})
    eng, _, retired = build(streams)
    sim = SimEngine(eng.config, cost, n_ctx_total=16 * 64, n_seq_max=16,
                    tpot_target_s=0.060)
    bursts = {0: [(0.4, 30)] * 7, 20: [(None, 20)] * 6, 45: [(0.3, 10)] * 9}
    sim_refused: list[int] = []
    sim_now, trace_engine, trace_sim = 0.0, [], []
    for step in range(400):
        for i, (target, max_tokens) in enumerate(bursts.get(step, [])):
            now = eng._clock()
            r = request(max_tokens=max_tokens)
            r.arrival_s = now
            if target is not None:
                r.ttft_target_s = now + target
            eng.add(r)
            s = SimRequest(1000 * step + i, "chat", sim_now, n_prompt=4, max_tokens=max_tokens)
            if target is not None:
                s.ttft_target_s = sim_now + target
            if sim.refusal(s, sim_now) is not None:
                sim_refused.append(1000 * step + i)
            else:
                sim.waiting.append(s)
        if not eng.has_work and not sim.has_work and step > 45:
            break
        eng.step()
        plan, seconds = sim.start_step(sim_now)
        sim_now += seconds
        sim.end_step(plan, sim_now)
        for w, trace in ((eng.width, trace_engine), (sim.width, trace_sim)):
            trace.append(None if w is None else (w.concurrency, w.reason, w.on_time))
        assert len(eng.running) == len(sim.running), step
        assert abs(eng._clock() - sim_now) < 1e-9
    assert trace_engine == trace_sim
    assert {w[1] for w in trace_engine if w} >= {"tpot", "ttft"}
    refused = [r for r in retired if r.status == RequestStatus.REJECTED]
    assert len(refused) == len(sim_refused) > 0
