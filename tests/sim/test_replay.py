"""The server records its traffic; the simulator replays the trace and makes the same
decisions: which worker each request went to (the ``Dispatcher`` log), where models were
loaded, how every request ended and how each tenant's fair-share charge was settled (the
``ControlCore`` log). On a hand-moved clock, the same arrivals into the runtime and into a
simulated replica get the same variants, the same re-plans and the same rejections.
Inside one model, the same arrivals make the same
slot choices in the server's engine and the simulator's: which slot each request is
admitted into, which prefixes are retained and handed out, and which sequences move."""

from __future__ import annotations

import dataclasses
import random
import threading
from pathlib import Path
from typing import Any

import pytest

from sluice.backends.base import ModelSpec
from sluice.backends.synthetic import SyntheticBackend, SyntheticGenerative
from sluice.config import Config
from sluice.engine.continuous import ContinuousEngine, EngineConfig
from sluice.engine.request import Final, Request, RequestStatus, SamplingParams
from sluice.engine.runtime import Runtime
from sluice.policy.step.slot_table import SlotTable
from sluice.policy.step.step_cost import OnlineStepCost, StepCost
from sluice.policy.step.tpot_budget import TpotBudget
from sluice.sim import SimConfig, read_trace, simulate
from sluice.sim.clock import EventLoop
from sluice.sim.engine import SimEngine
from sluice.sim.replica import SimReplica
from sluice.sim.request import SimRequest

CHAT = {"load_s": 0.002, "n_seq_max": 4, "n_ctx_per_seq": 256, "step_fixed_s": 0.001,
        "decode_per_seq_s": 0.0002, "prefill_per_token_s": 0.00001}
ONESHOT = {"load_s": 0.002, "batch_fixed_s": 0.001, "per_item_s": 0.0005}


def config(tmp_path: Path, router: str, scheduler: str = "fifo") -> Config:
    return Config.model_validate({
        "server": {"trace_file": str(tmp_path / "trace.jsonl")},
        "scheduling": {"router": router, "scheduler": scheduler, "queue_capacity": 64},
        "workers": {"count": 2, "budget_bytes": 800_000_000, "inbox_capacity": 16},
        "batching": {"max_batch_size": 4, "max_wait_ms": 1},
        "models": [
            {"id": "a", "kind": "oneshot", "backend": "synthetic", "memory_bytes": 300_000_000,
             "options": ONESHOT},
            {"id": "b", "kind": "oneshot", "backend": "synthetic", "memory_bytes": 300_000_000,
             "task": "classification", "options": ONESHOT},
            {"id": "chat", "kind": "generative", "backend": "synthetic", "task": "generation",
             "memory_bytes": 500_000_000, "options": CHAT},
        ],
    })


MODELS = ["a", "chat", "b", "b", "a", "chat", "chat", "a", "b", "chat", "a", "a", "b", "chat",
          "b", "a", "chat", "b", "a", "chat"]


TENANTS = ["ann", "bob", "cy"]


def run_server(cfg: Config, sequential: bool) -> tuple[list[tuple[int, int]], list[str],
                                                       list[tuple[int, str]],
                                                       list[tuple[int, str, int, int]]]:
    """Submit ``MODELS`` (one at a time, each waiting for the last to end, or all at
    once); returns the dispatcher's decisions, the end states, the loads per worker and
    the fair-share settlements."""
    rt = Runtime(cfg.runtime_config(), {"synthetic": SyntheticBackend()})
    rt._dispatcher.decisions = []
    rt._core.settlements = []
    loads: list[tuple[int, str]] = []
    rt.observer.model_loaded = lambda w, m, _s: loads.append((w, m))  # type: ignore[method-assign]
    rt.start()
    ends: dict[int, str] = {}
    try:
        done = threading.Semaphore(0)
        for i, model in enumerate(MODELS):
            spec = rt.spec_for(model)
            assert spec is not None
            kwargs: dict[str, Any] = (
                {"prompt_tokens": list(range(3, 3 + 8 + i)),
                 "params": SamplingParams(max_tokens=4 + i % 3, ignore_eos=True)}
                if spec.kind == "generative" else {"input": f"text {i}"})
            req = rt.new_request(model, tenant_id=TENANTS[i % len(TENANTS)], **kwargs)

            def on_event(event: Any, rid: int = req.request_id) -> None:
                if isinstance(event, Final):
                    ends[rid] = event.status.name.lower()
                    done.release()

            req.listeners.append(on_event)
            assert rt.try_submit(req) is None
            if sequential:
                assert done.acquire(timeout=10)
        if not sequential:
            for _ in MODELS:
                assert done.acquire(timeout=10)
    finally:
        rt.stop(drain_timeout_s=2.0)
    assert rt._dispatcher.decisions is not None and rt._core.settlements is not None
    return (list(rt._dispatcher.decisions), [ends[i] for i in sorted(ends)], loads,
            sorted(rt._core.settlements))


def per_worker(loads: list[tuple[int, str]]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for w, m in loads:
        out.setdefault(w, []).append(m)
    return out


@pytest.mark.parametrize(("router", "sequential", "scheduler"), [
    ("residency_aware", True, "fifo"), ("least_loaded", True, "fifo"),
    ("round_robin", True, "fifo"), ("round_robin", False, "fifo"),
    ("residency_aware", True, "wfq"),
])
def test_replayed_trace_makes_the_same_decisions(tmp_path: Path, router: str,
                                                 sequential: bool, scheduler: str) -> None:
    cfg = config(tmp_path, router, scheduler)
    decisions, ends, loads, settlements = run_server(cfg, sequential)
    arrivals = list(read_trace(tmp_path / "trace.jsonl"))
    assert [a.model for a in arrivals] == MODELS
    assert [a.tenant for a in arrivals] == [TENANTS[i % 3] for i in range(len(MODELS))]
    assert [a.input_chars for a in arrivals] == [  # one-shot inputs' lengths, none for LLM
        0 if m == "chat" else len(f"text {i}") for i, m in enumerate(MODELS)]
    assert all(a.time_s >= 0 for a in arrivals)
    # A bare runtime loads nothing at start (the HTTP server preloads its default model).
    sim_config = dataclasses.replace(SimConfig.from_config(cfg), preload=())
    report, fleet = simulate(sim_config, arrivals, keep_requests=True, record_decisions=True)
    replica = fleet.replicas[0]
    assert replica.dispatcher.decisions == decisions
    assert fleet.requests is not None
    assert [r.status for r in fleet.requests] == ends == ["completed"] * len(MODELS)
    assert per_worker(replica.loads) == per_worker(loads)
    # every request was charged at its pop and settled at its end, alike on both sides: a
    # generative one its prompt + max_tokens, then the prompt and the tokens it generated
    assert replica.core.settlements is not None
    assert sorted(replica.core.settlements) == settlements
    assert len(settlements) == len(MODELS)
    assert {(rid, tenant) for rid, tenant, _, _ in settlements} == {
        (i + 1, TENANTS[i % 3]) for i in range(len(MODELS))}
    assert {charged for _, _, charged, _ in settlements} > {1}  # generative costs too
    assert RequestStatus.COMPLETED.name.lower() == "completed"
    assert report["requests"] == len(MODELS)


def arrivals(seed: int = 7) -> dict[int, list[tuple[int | None, int, int]]]:
    """Step -> requests arriving before it: (prompt family or None, prompt tokens,
    max_tokens). A family's prompts share their first ``FAMILY_TOKENS`` tokens; every other
    prompt token is the request's own. Bursts and lengths such that slots end out of order,
    prefixes are kept in place or copied, retained slots are handed out and dropped past a
    cap, and sequences move down."""
    rng = random.Random(seed)
    out: dict[int, list[tuple[int | None, int, int]]] = {}
    for step in sorted(rng.sample(range(80), 24)):
        out[step] = [(rng.choice([None, 0, 1, 2, 3]), rng.randint(9, 16), rng.randint(2, 14))
                     for _ in range(rng.choice([1, 1, 2, 3]))]
    return out


FAMILY_TOKENS = 8


def slot_choices(table: SlotTable) -> tuple[object, ...]:
    """What a slot table holds, comparable across the engine and the simulator: each slot's
    kind and request, the retained slots least recently used first, the KV blocks free."""
    table.check_integrity()
    return (tuple((e.kind, e.request_id) for e in table.layout()),
            tuple(r.slot for r in table.retained()), table.kv.free_blocks)


@pytest.mark.parametrize("config", [
    EngineConfig(kv_block_tokens=8, min_prefix_tokens=4, max_batch_tokens=24,
                 prefill_chunk_tokens=8),
    EngineConfig(kv_block_tokens=8, min_prefix_tokens=4, max_retained_slots=2),
    EngineConfig(kv_block_tokens=8, min_prefix_tokens=4, max_retained_slots=1,
                 cache_ram_bytes=None),
    EngineConfig(kv_block_tokens=8, min_prefix_tokens=4, retain_prefixes=False),
], ids=["retained", "retained-capped", "capped-with-ram-cache", "no-retention"])
def test_the_engine_and_the_simulator_make_the_same_slot_choices(config: EngineConfig) -> None:
    """The same arrivals, step by step, into ``ContinuousEngine`` (the synthetic model) and
    ``SimEngine``: after every step the same slot holds the same request (or the same
    retained prefix, or nothing) on both sides."""
    n_slots, n_ctx_per_seq = 6, 64
    schedule = arrivals()
    model = SyntheticGenerative(ModelSpec(
        "chat", "generative", "synthetic", 1, speculation="off",
        options={"speed_scale": 0.0, "n_seq_max": n_slots, "n_ctx_per_seq": n_ctx_per_seq,
                 "vocab_size": 4096}))
    eng = ContinuousEngine(model, config, lambda: 0.0, lambda _r: None)
    sim = SimEngine(config, StepCost(0.01, 0.001, 0.0001), n_ctx_total=n_slots * n_ctx_per_seq,
                    n_seq_max=n_slots)
    own = iter(range(1000, 4000))
    reqs: list[Request] = []
    sim_now, choices_engine, choices_sim = 0.0, [], []
    for step in range(400):
        for family, n_prompt, max_tokens in schedule.get(step, []):
            rid = len(reqs) + 1
            shared = [] if family is None else [100 + 10 * family + i
                                                for i in range(FAMILY_TOKENS)]
            prompt = tuple(shared + [next(own) for _ in range(n_prompt - len(shared))])
            req = Request(request_id=rid, model_id="chat", kind="generative", arrival_s=0.0,
                          prompt_tokens=prompt, params=SamplingParams(
                              max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
            req.mark_queued(0.0)
            reqs.append(req)
            eng.add(req)
            s = SimRequest(rid, "chat", sim_now, n_prompt=n_prompt, max_tokens=max_tokens,
                           prefix_id=family, prefix_tokens=FAMILY_TOKENS if family is not None
                           else 0)
            sim.waiting.append(s)
        if not eng.has_work and not sim.has_work and step > max(schedule):
            break
        eng.step()
        plan, seconds = sim.start_step(sim_now)
        sim_now += seconds
        sim.end_step(plan, sim_now)
        choices_engine.append(slot_choices(eng.slots))
        choices_sim.append(slot_choices(sim.slots))
        assert choices_engine[-1] == choices_sim[-1], f"step {step}"
    assert all(r.status == RequestStatus.COMPLETED for r in reqs)
    assert not eng.has_work and not sim.has_work
    kinds = {kind for c in choices_engine for kind, _ in c[0]}
    assert "running" in kinds
    assert ("retained" in kinds) == config.retain_prefixes
    if config.retain_prefixes:
        assert eng.retained_prefix_tokens > 0  # a request was admitted into a kept prefix
    if config.max_retained_slots is not None:
        assert "free" in kinds  # retained slots dropped past the cap
    if config.cache_ram_bytes != 0:  # dropped prefixes came back from host memory
        assert eng.prompt_cache is not None and sim.prompt_cache is not None
        assert eng.prompt_cache.restored_tokens == sim.prompt_cache.restored_tokens > 0
    assert eng.reused_prefix_tokens > eng.retained_prefix_tokens  # and copied from donors
    if not config.retain_prefixes or config.max_retained_slots is not None:
        assert eng.slot_moves > 0  # a running sequence moved down into a hole


class HandClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def group_config() -> Config:
    def variant(model_id: str, accuracy: float, ms: float) -> dict[str, Any]:
        return {"id": model_id, "kind": "oneshot", "backend": "synthetic",
                "memory_bytes": 10_000_000, "task": "classification",
                "options": {"accuracy": accuracy, "load_s": 0.0,
                            "service_ms": {"1": ms, "8": 8 * ms}}}

    return Config.model_validate({
        "workers": {"count": 1, "budget_bytes": 1_000_000_000, "inbox_capacity": 64},
        "batching": {"max_batch_size": 8},
        "models": [variant("big", 0.9, 30.0), variant("small", 0.8, 1.0)],
        "groups": [{"id": "g", "variants": ["big", "small"], "default_deadline_ms": 125}],
    })


GROUP_ARRIVALS: list[tuple[float, str, float | None]] = [
    # (seconds after the start, model, deadline in seconds or None: the group's default)
    (0.0, "g", 0.125), (0.0, "g", None), (0.0, "g", 0.125),  # one 90 ms batch of big
    (0.0, "g", 0.125),  # a fourth would make it 120 ms: small
    (0.0, "big", 0.125),  # a variant named directly: planned alone, never moved
    (0.0, "g", 0.001),  # no variant finishes in 1 ms: refused at once
    (0.050, "g", 0.2),  # nothing ran: the big batch now ends late, two of it move
    (0.1245, "g", 0.2),  # 0.5 ms left for the first four: they fail now
]


def test_the_runtime_and_a_simulated_replica_plan_and_replan_alike() -> None:
    """The same group arrivals on one hand-moved clock into a ``Runtime`` (its threads not
    started: nothing runs, requests stay in its scheduler) and a ``SimReplica`` (its event
    loop not run: requests wait in its worker's inbox), each re-planning after every
    arrival: the same variant and deadline for each arrival, the same moves, and every
    request on the same model in the same state (queued, or refused
    ``deadline_infeasible``) on both sides."""
    cfg = group_config()
    clock = HandClock()
    rt = Runtime(cfg.runtime_config(), {"synthetic": SyntheticBackend()}, clock=clock)
    rt.variants.tracker.decisions = []
    sim_config = dataclasses.replace(SimConfig.from_config(cfg), preload=())
    sim_ends: list[SimRequest] = []
    replica = SimReplica(0, sim_config, EventLoop(), sim_ends.append)
    assert replica.tracker is not None
    replica.tracker.decisions = []
    start = clock.now
    served: list[Request] = []
    simulated: list[SimRequest] = []
    for rid, (at_s, model, deadline) in enumerate(GROUP_ARRIVALS, start=1):
        clock.now = now = start + at_s
        req = rt.new_request(model, input="x",
                             deadline_s=None if deadline is None else now + deadline)
        assert req.request_id == rid
        rt.try_submit(req)
        with rt._cv:
            rt._replan_queued(now)
        served.append(req)
        s = SimRequest(rid, model, now, deadline_s=None if deadline is None
                       else now + deadline, input_chars=1)
        replica.submit(s, now)  # re-plans as its dispatcher pass does
        simulated.append(s)
    assert replica.tracker.decisions == rt.variants.tracker.decisions
    decisions = rt.variants.tracker.decisions
    assert [(rid, v) for rid, g, v, _ in decisions if g == "moved"] == [(1, "small"),
                                                                       (2, "small")]
    assert [(rid, v) for rid, g, v, _ in decisions if g == "g"] == [
        (1, "big"), (2, "big"), (3, "big"), (4, "small"), (6, None), (7, "small"),
        (8, "big")]
    assert decisions[1][3] == pytest.approx(start + 0.125)  # the group's default deadline
    status = {"queued": RequestStatus.QUEUED, "rejected": RequestStatus.REJECTED}
    assert [(r.model_id, r.status, r.final.error_code if r.final else None)
            for r in served] == [
        (s.model, status[s.status], s.reason) for s in simulated]
    assert [r.status for r in served].count(RequestStatus.REJECTED) == 5
    assert all(s.worker == 0 for s in simulated if s.status == "queued")  # in the inbox
    assert len(rt._scheduler) == 3  # the server's stayed in its scheduler


def test_the_engine_and_the_simulator_refuse_and_budget_alike() -> None:
    """The same arrivals with first-token targets into ``ContinuousEngine`` (its step-time
    model held at the simulator's cost) and ``SimEngine``, before any step runs (every
    other target just before or after the engine's predicted first token): the same
    arrivals are refused ``deadline_infeasible`` (the rest join the line), and after
    every arrival the next step's width and budget are the same on both sides."""
    cost = StepCost(0.004, 0.002, 0.00005)
    n_slots, n_ctx_per_seq, tpot = 4, 256, 0.010
    config = EngineConfig(kv_block_tokens=8)
    model = SyntheticGenerative(ModelSpec(
        "chat", "generative", "synthetic", 1, speculation="off", tpot_target_s=tpot,
        options={"speed_scale": 0.0, "n_seq_max": n_slots, "n_ctx_per_seq": n_ctx_per_seq,
                 "vocab_size": 4096}))
    now = 10.0
    eng = ContinuousEngine(model, config, lambda: now, lambda _r: None)
    eng.step_cost = OnlineStepCost(cost, min_samples=10**9)
    sim = SimEngine(config, cost, n_ctx_total=n_slots * n_ctx_per_seq, n_seq_max=n_slots,
                    tpot_target_s=tpot)
    rng = random.Random(3)
    refused_engine, refused_sim = [], []
    for rid in range(1, 61):
        n_prompt, max_tokens = rng.randint(8, 120), rng.randint(4, 100)
        if rid % 2:
            target = now + rng.uniform(0.02, 8.0)
        else:  # 3 % either side of the engine's own prediction: a changed line shows
            predicted = eng.predict_ttft(n_prompt, 1, None, max_tokens).ttft_s
            target = now + predicted * rng.choice([0.97, 1.03])
        req = Request(request_id=rid, model_id="chat", kind="generative", arrival_s=now,
                      prompt_tokens=tuple(range(5, 5 + n_prompt)), ttft_target_s=target,
                      params=SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        req.mark_queued(now)
        eng.add(req)
        if req.status == RequestStatus.REJECTED:
            assert req.final is not None and req.final.error_code == "deadline_infeasible"
            refused_engine.append(rid)
        s = SimRequest(rid, "chat", now, n_prompt=n_prompt, max_tokens=max_tokens)
        s.ttft_target_s = target
        if sim.refusal(s, now) is None:
            sim.waiting.append(s)
        else:
            refused_sim.append(rid)
        assert refused_engine == refused_sim, f"arrival {rid}"
        eng.budget()
        sim.budget(now)
        assert eng.width == sim.width, f"arrival {rid}"  # the line's width, as both plan it
    assert 10 <= len(refused_engine) <= 50  # some refused, some of the line kept
    budget_engine, budget_sim = eng.budget(), sim.budget(now)
    assert isinstance(budget_engine, TpotBudget) and isinstance(budget_sim, TpotBudget)
    assert budget_engine.step_limit_s == budget_sim.step_limit_s
    assert eng.width is not None and eng.width == sim.width
