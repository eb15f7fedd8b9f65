"""The simulator: conservation under every kind of load, determinism, and agreement with
what queueing theory and the step-time model say exactly."""

from __future__ import annotations

import itertools
import random
from dataclasses import fields, replace
from typing import Any

import pytest

from sluice.policy.capacity.keep_alive import PINNED, STAY, KeepAlive
from sluice.policy.capacity.quota import QuotaLimits
from sluice.policy.queues.control_core import QueueConfig
from sluice.policy.step.step_cost import StepCost
from sluice.policy.step.step_data import EngineConfig
from sluice.policy.variants.planner import PlannerConfig
from sluice.policy.variants.variant_tracker import GroupPlan, VariantInfo, VariantTracker
from sluice.policy.worker_config import WorkerConfig
from sluice.sim import (
    Arrival,
    SimConfig,
    SimGroup,
    SimModel,
    generate,
    parse_spec,
    simulate,
    simulate_closed_loop,
)
from sluice.sim.costs import ModelCost
from sluice.sim.request import SimRequest

MB = 1_000_000


def oneshot(model_id: str, fixed_s: float = 0.004, item_s: float = 0.001, mb: int = 300,
            load_s: float = 0.05, accuracy: float = 0.0) -> SimModel:
    cost = ModelCost(load_s, (1, 2), (fixed_s + item_s, fixed_s + 2 * item_s))
    return SimModel(model_id, "oneshot", mb * MB, load_s, cost, accuracy=accuracy)


def chat(model_id: str = "chat", mb: int = 500, n_seq: int = 8, ctx_per_seq: int = 512,
         step: StepCost | None = None) -> SimModel:
    step = step or StepCost(0.003, 0.0005, 0.00005)
    return SimModel(model_id, "generative", mb * MB, 1.0, ModelCost(0.1, step=step),
                    n_seq_max=n_seq, n_ctx_total=ctx_per_seq * n_seq)


QUEUE_FIELDS = {f.name for f in fields(QueueConfig)}
WORKER_FIELDS = {f.name for f in fields(WorkerConfig)}


def worker(budget_bytes: int = 2_000 * MB, **kw: Any) -> WorkerConfig:
    """What every simulated worker runs: ``WorkerConfig``'s defaults but for ``kw``."""
    return WorkerConfig(worker_id=0, budget_bytes=budget_bytes, **kw)


def fleet_config(**kw: Any) -> SimConfig:
    models = {m.model_id: m for m in (oneshot("a"), oneshot("b", 0.002, 0.0005), chat())}
    base = SimConfig(models=models, workers=2, worker=worker(800 * MB),
                     queue=QueueConfig(queue_capacity=32))
    queue = {k: kw.pop(k) for k in list(kw) if k in QUEUE_FIELDS}
    limits = {k: kw.pop(k) for k in list(kw) if k in WORKER_FIELDS}
    return replace(base, queue=replace(base.queue, **queue),
                   worker=replace(base.worker, **limits), **kw)


WORKLOADS = [
    "poisson:rate=60,duration=20,model=chat,prompt=10,output=16",
    "poisson:rate=600,duration=10,model=chat:1|a:2|b:2,prompt=40,output=8,deadline_ms=400",
    "onoff:rate=900,off_rate=20,on_s=1,off_s=2,duration=20,model=a|b,deadline_ms=100",
    "diurnal:rate=300,trough=0.1,period_s=10,duration=20,model=chat|a,prompt=300,output=64",
    "poisson:rate=200,duration=10,model=chat,prompt=20,output=32,prefixes=3,prefix_tokens=18",
]


@pytest.mark.parametrize("spec", WORKLOADS)
@pytest.mark.parametrize("scheduler", ["fifo", "workload_aware", "priority_edf", "wfq"])
def test_every_request_ends_exactly_once(spec: str, scheduler: str) -> None:
    config = fleet_config(scheduler=scheduler,
                          tenant_weights={"t0": 1.0, "t1": 3.0})
    arrivals = [replace(a, tenant=f"t{i % 2}", priority=i % 3)
                for i, a in enumerate(generate(parse_spec(spec), seed=7))]
    report, fleet = simulate(config, arrivals, keep_requests=True)
    assert fleet.requests is not None and len(fleet.requests) == len(arrivals)
    assert all(r.is_terminal for r in fleet.requests)
    assert sum(report["overall"]["states"].values()) == len(arrivals)
    for r in fleet.requests:
        if r.status == "completed":
            assert r.end_s is not None and r.first_token_s is not None
            assert r.arrival_s <= r.first_token_s <= r.end_s
            assert r.deadline_s is None or r.end_s < r.deadline_s  # never completed late
            assert r.generated == (r.max_tokens if fleet.config.models[r.model].kind ==
                                   "generative" else 0)


def test_overload_rejects_and_expires_but_loses_nothing() -> None:
    spec = parse_spec("poisson:rate=3000,duration=5,model=a|chat,prompt=30,output=20,"
                      "deadline_ms=150")
    report, _ = simulate(fleet_config(replicas=3, replica_router="round_robin"),
                         generate(spec, seed=3))
    states = report["overall"]["states"]
    assert states.get("rejected", 0) > 0 and states.get("expired", 0) > 0
    assert sum(states.values()) == report["requests"]
    assert sum(report["rejections"].values()) == states["rejected"]


def test_same_seed_same_report() -> None:
    spec = parse_spec(WORKLOADS[1])
    one, _ = simulate(fleet_config(), generate(spec, seed=5))
    two, _ = simulate(fleet_config(), generate(spec, seed=5))
    other, _ = simulate(fleet_config(), generate(spec, seed=6))
    for r in (one, two, other):
        r.pop("wall_s")
    assert one == two and one != other


def test_md1_queue_matches_pollaczek_khinchine() -> None:
    """One worker, batches of one, a fixed 10 ms service: M/D/1, whose mean wait is
    ρ / (2 μ (1 - ρ)) exactly."""
    service_s, rho = 0.010, 0.7
    model = SimModel("m", "oneshot", MB, 0.0, ModelCost(0.0, (1,), (service_s,)))
    config = SimConfig(models={"m": model}, workers=1,
                       worker=worker(max_batch_size=1, max_wait_s=0.0, inbox_capacity=1),
                       queue=QueueConfig(queue_capacity=10_000))
    spec = parse_spec(f"poisson:rate={rho / service_s},requests=40000,model=m")
    report, _ = simulate(config, generate(spec, seed=11))
    mean_wait_s = report["overall"]["e2e_s"]["mean"] - service_s
    expected_s = rho / (2 * (1 / service_s) * (1 - rho))
    assert mean_wait_s == pytest.approx(expected_s, rel=0.08)
    assert report["utilisation"] == pytest.approx(rho, rel=0.03)


def test_a_lone_llm_request_costs_its_steps_exactly() -> None:
    """Alone, a 100-token prompt with 20 output tokens: a load, one prefill step (chunk
    ≤ 256), then 19 decode steps; TTFT and end-to-end follow from the step model."""
    step = StepCost(0.01, 0.002, 0.0001, 0.00001)
    config = SimConfig(models={"chat": chat(step=step)}, workers=1)
    report, fleet = simulate(config, [Arrival(0.0, "chat", prompt_tokens=100,
                                              output_tokens=20)], keep_requests=True)
    assert fleet.requests is not None
    (req,) = fleet.requests
    load_s = 0.1
    prefill_s = step.predict_s(0, 100, 0)
    assert req.first_token_s == pytest.approx(load_s + prefill_s)
    decode_s = sum(step.predict_s(1, 0, 100 + i) for i in range(19))
    assert req.end_s == pytest.approx(load_s + prefill_s + decode_s)
    assert report["overall"]["tpot_s"]["mean"] == pytest.approx(decode_s / 19)


def test_continuous_batching_admits_into_free_slots_and_kv() -> None:
    """Two slots of 64 tokens: at most two sequences at once; a third waits for a slot."""
    config = SimConfig(models={"chat": chat(n_seq=2, ctx_per_seq=64)}, workers=1,
                       worker=worker(engine=EngineConfig(kv_block_tokens=16)))
    arrivals = [Arrival(0.0, "chat", prompt_tokens=8, output_tokens=24) for _ in range(3)]
    _, fleet = simulate(config, arrivals, keep_requests=True)
    assert fleet.requests is not None
    a, b, c = fleet.requests
    assert a.started_s == b.started_s and c.started_s is not None
    assert c.started_s >= min(x.end_s or 0 for x in (a, b))
    too_long = [Arrival(0.0, "chat", prompt_tokens=50, output_tokens=30)]
    report, _ = simulate(config, too_long)
    assert report["overall"]["states"] == {"failed": 1}


def test_prefix_reuse_shortens_prefill() -> None:
    """Requests sharing a 200-token prefix copy it from a running donor: less prefill, so
    a lower TTFT than the same prompts with nothing shared."""
    def run(prefixes: int) -> float:
        spec = parse_spec(f"poisson:rate=40,requests=400,model=chat,prompt=240,output=32,"
                          f"prefixes={prefixes},prefix_tokens=200")
        report, _ = simulate(SimConfig(models={"chat": chat()}, workers=1),
                             generate(spec, seed=2))
        return float(report["overall"]["ttft_s"]["mean"])
    assert run(1) < 0.8 * run(0)


def test_a_retained_prefix_serves_requests_that_arrive_one_at_a_time() -> None:
    """At a low rate nothing is running when the next request arrives: only a prefix the
    engine retained from an ended sequence can spare its prefill."""
    def run(retain: bool) -> float:
        spec = parse_spec("poisson:rate=2,requests=60,model=chat,prompt=240,output=8,"
                          "prefixes=1,prefix_tokens=200")
        config = SimConfig(models={"chat": chat()}, workers=1,
                           worker=worker(engine=EngineConfig(retain_prefixes=retain)))
        report, _ = simulate(config, generate(spec, seed=3))
        return float(report["overall"]["ttft_s"]["mean"])
    assert run(True) < 0.6 * run(False)


def test_variant_group_moves_to_the_fast_variant_under_load() -> None:
    models = {"big": oneshot("big", 0.020, 0.004, mb=100, accuracy=0.9),
              "small": oneshot("small", 0.002, 0.0005, mb=100, accuracy=0.8)}
    group = SimGroup("g", ("big", "small"), PlannerConfig(max_batch_size=8))
    config = SimConfig(models=models, groups=(group,), workers=1,
                       queue=QueueConfig(queue_capacity=256))
    light, _ = simulate(config, generate(parse_spec(
        "poisson:rate=5,duration=60,model=g,deadline_ms=200"), seed=1))
    heavy, _ = simulate(config, generate(parse_spec(
        "poisson:rate=400,duration=60,model=g,deadline_ms=200"), seed=1))
    assert light["variant_mix"]["g"].get("small", 0) == 0
    assert heavy["variant_mix"]["g"].get("small", 0) > heavy["variant_mix"]["g"].get("big", 0)


def test_shared_quota_across_replicas() -> None:
    """A tenant limited to 20 requests/s gets about 20/s across 4 replicas, not 80."""
    limits = QuotaLimits(requests_per_s=20.0, request_burst=20.0, tokens_per_s=None,
                         token_capacity=1.0, max_concurrent=None)
    config = fleet_config(replicas=4, tenant_limits={"t": limits})
    spec = parse_spec("poisson:rate=100,duration=30,model=b,tenant=t")
    report, _ = simulate(config, generate(spec, seed=4))
    admitted = report["requests"] - report["rejections"].get("quota", 0)
    assert admitted == pytest.approx(20 * 30 + 20, rel=0.05)


def test_random_fleets_conserve() -> None:
    rng = random.Random(0)
    for _ in range(15):
        config = fleet_config(
            replicas=rng.randint(1, 3), workers=rng.randint(1, 3),
            inbox_capacity=rng.randint(1, 6), queue_capacity=rng.randint(1, 40),
            max_batch_size=rng.randint(1, 8), eviction=rng.choice(["lru", "cost_aware"]),
            router=rng.choice(["round_robin", "least_loaded", "residency_aware"]),
            replica_router=rng.choice(["round_robin", "least_loaded", "affinity"]),
            engine=EngineConfig(mode=rng.choice(["continuous", "static", "serial"]),
                                max_batch_tokens=rng.choice([64, 512])))
        spec = parse_spec(f"poisson:rate={rng.randint(20, 800)},duration=4,model=a|b|chat,"
                          f"prompt={rng.randint(1, 200)},output={rng.randint(1, 40)},"
                          f"deadline_ms={rng.randint(50, 3000)}")
        report, _ = simulate(config, generate(spec, seed=rng.randint(0, 99)))
        assert sum(report["overall"]["states"].values()) == report["requests"]


def test_overhead_adds_latency_but_occupies_no_worker() -> None:
    """A request's time outside the workers delays it without slowing anyone else: with
    30 ms of overhead each request starts 30 ms later and the worker is busy as long."""
    base = chat()
    slow = replace(base, cost=replace(base.cost, overhead_s=0.030))
    arrivals = [Arrival(0.0, "chat", prompt_tokens=8, output_tokens=4),
                Arrival(0.001, "chat", prompt_tokens=8, output_tokens=4)]
    _, plain = simulate(SimConfig(models={"chat": base}), arrivals, keep_requests=True)
    _, late = simulate(SimConfig(models={"chat": slow}), arrivals, keep_requests=True)
    assert plain.requests is not None and late.requests is not None
    for p, q in zip(plain.requests, late.requests, strict=True):
        assert q.arrival_s == p.arrival_s
        assert q.started_s == pytest.approx((p.started_s or 0) + 0.030)
    assert late.replicas[0].busy_s() == pytest.approx(plain.replicas[0].busy_s())


def test_step_time_spread_keeps_the_mean_and_lengthens_queues() -> None:
    """``cv`` draws each step's time around the model's mean: the same work takes about
    as long in total, and near saturation the queue grows (Pollaczek-Khinchine)."""
    def run(cv: float) -> tuple[float, float]:
        model = chat()
        model = replace(model, cost=replace(model.cost, cv=cv))
        spec = parse_spec("poisson:rate=70,duration=60,model=chat,prompt=10,output=16")
        report, fleet = simulate(SimConfig(models={"chat": model},
                                           queue=QueueConfig(queue_capacity=10_000)),
                                 generate(spec, seed=9))
        return fleet.replicas[0].busy_s(), report["overall"]["ttft_s"]["p95"]
    busy0, ttft0 = run(0.0)
    busy1, ttft1 = run(0.8)
    assert busy1 == pytest.approx(busy0, rel=0.05)
    assert ttft1 > 1.2 * ttft0


def test_a_tpot_target_caps_the_steps_the_engine_plans() -> None:
    """With a TPOT target the simulated engine plans with the server's ``TpotBudget``: a
    step of 8 decodes (3 + 8 × 2 = 19 ms) would exceed 0.85 × 15 ms, so no more than 4
    sequences decode at once (11 ms) and every completed request's TPOT stays within the
    target; without it, all 8 slots fill and TPOT passes the target."""
    step = StepCost(0.003, 0.002, 0.00005)
    spec = parse_spec("poisson:rate=150,duration=10,model=chat,prompt=10,output=16")
    arrivals = list(generate(spec, seed=4))

    def run(target_s: float | None) -> list[float]:
        model = replace(chat(step=step), tpot_target_s=target_s)
        report, fleet = simulate(SimConfig(models={"chat": model},
                                           queue=QueueConfig(queue_capacity=10_000)),
                                 arrivals, keep_requests=True)
        assert report["overall"]["states"] == {"completed": len(arrivals)}
        assert fleet.requests is not None
        return [((r.end_s or 0) - (r.first_token_s or 0)) / (r.generated - 1)
                for r in fleet.requests]
    assert max(run(None)) > 0.015
    assert max(run(0.015)) <= 0.015


def test_a_first_token_deadline_refuses_what_would_miss_it() -> None:
    """A model's first-token deadline, as the server's engine keeps it: under 2× overload a
    request whose predicted first token (``predict_engine_ttft``) falls past the deadline
    is refused on reaching the engine (``deadline_infeasible``), the rest get their first
    token by it (a prediction can err: one that passes it waiting ends ``expired``); with
    no deadline every request completes, most of them far later."""
    step = StepCost(0.01, 0.002, 0.0001)
    spec = parse_spec("poisson:rate=40,duration=20,model=chat,prompt=10,output=16")
    arrivals = list(generate(spec, seed=5))

    def run(ttft_deadline_s: float | None) -> tuple[dict[str, object], list[SimRequest]]:
        model = replace(chat(step=step), ttft_deadline_s=ttft_deadline_s)
        report, fleet = simulate(SimConfig(models={"chat": model},
                                           queue=QueueConfig(queue_capacity=10_000),
                                           worker=worker(inbox_capacity=10_000)), arrivals,
                                 keep_requests=True)
        assert fleet.requests is not None
        return report, fleet.requests
    report, reqs = run(0.3)
    assert report["rejections"].get("deadline_infeasible", 0) > len(arrivals) // 4
    for r in reqs:
        if r.first_token_s is not None:
            assert r.ttft_deadline_s is not None
            assert r.first_token_s <= r.ttft_deadline_s + 1e-9
    unbounded, _ = run(None)
    assert unbounded["overall"]["states"] == {"completed": len(arrivals)}
    assert unbounded["overall"]["ttft_s"]["p50"] > 1.0


def test_a_decode_step_table_replaces_the_linear_decode_terms() -> None:
    """A cost entry's ``decode_step_ms`` (step time by decodes, measured) is what a decode
    step costs, interpolated between measured counts; prompt tokens still cost the step
    model's ``per_prefill_token_s``. Alone, a request's 19 decode steps cost 19 × the
    table's 1-decode time; two at once, the 2-decode time each step."""
    from sluice.sim.costs import model_cost

    entry = {"step_cost": {"base_s": 0.01, "per_decode_token_s": 0.002,
                           "per_prefill_token_s": 0.0001},
             "decode_step_ms": {"1": 16.0, "4": 44.0}, "load_s": 0.0}
    cost = model_cost("chat", "generative", "llamacpp", {}, 0.0, {"chat": entry})
    assert cost.step_s(1, 0, 500) == pytest.approx(0.016)
    assert cost.step_s(2, 0, 0) == pytest.approx(0.016 + 28.0 / 3 / 1000)
    assert cost.step_s(4, 10, 0) == pytest.approx(0.044 + 0.001)
    assert cost.step_s(0, 100, 0) == pytest.approx(0.01 + 0.01)
    model = replace(chat(), cost=cost)
    _, fleet = simulate(SimConfig(models={"chat": model}),
                        [Arrival(0.0, "chat", prompt_tokens=100, output_tokens=20),
                         Arrival(0.0, "chat", prompt_tokens=100, output_tokens=20)],
                        keep_requests=True)
    assert fleet.requests is not None
    for req in fleet.requests:
        assert req.first_token_s == pytest.approx(cost.step_s(0, 200, 0))
        decoding_s = (req.end_s or 0) - (req.first_token_s or 0)
        assert decoding_s == pytest.approx(19 * cost.step_s(2, 0, 0))


def test_the_engines_step_tally_is_read_as_decode_and_prefill_step_tables() -> None:
    """A cost entry's ``step_times`` (the engine's tally, as /status.json publishes it):
    steps of decodes alone give the decode table; steps that fed a prompt what feeding
    it added (their mean time less the decode table's at their decodes; at 0 decodes
    the whole step), interpolated between measured decode counts and flat past them,
    corrected by ``per_prefill_token_s`` for more or fewer tokens than their mean;
    buckets of fewer than ``MIN_BUCKET_STEPS`` steps are left out and interpolated
    over. A lone request's TTFT is the 0-decode prefill step, its decodes the table's."""
    from sluice.sim.costs import MIN_BUCKET_STEPS, model_cost

    def bucket(steps: int, ms: float, tokens: int = 0) -> dict[str, float]:
        return {"steps": steps, "seconds": steps * ms / 1000, "prefill_tokens": steps * tokens}

    entry = {"step_cost": {"base_s": 0.01, "per_decode_token_s": 0.002,
                           "per_prefill_token_s": 0.001},
             "step_times": {"1": bucket(50, 16.0), "2": bucket(MIN_BUCKET_STEPS - 1, 99.0),
                            "3": bucket(40, 42.0), "0+prefill": bucket(20, 30.0, 18),
                            "2+prefill": bucket(30, 60.0, 20),
                            # verified drafts: not a plain decode or prefill step
                            "3+draft": bucket(40, 80.0), "2+prefill+draft": bucket(40, 90.0)},
             "load_s": 0.0}
    cost = model_cost("chat", "generative", "llamacpp", {}, 0.0, {"chat": entry})
    assert cost.decode_sizes == (1, 3) and cost.prefill_sizes == (0, 2)
    assert cost.step_s(1, 0, 0) == pytest.approx(0.016)
    assert cost.step_s(2, 0, 0) == pytest.approx(0.029)  # the 9-step bucket is not used
    assert cost.step_s(0, 18, 0) == pytest.approx(0.030)
    assert cost.step_s(2, 25, 0) == pytest.approx(0.029 + 0.031 + 5 * 0.001)
    assert cost.step_s(1, 19, 0) == pytest.approx(0.016 + 0.0305)  # added: between 0 and 2
    assert cost.step_s(3, 20, 0) == pytest.approx(0.042 + 0.031)  # flat past 2 decodes
    assert cost.step_s(3, 1, 0) == pytest.approx(0.042 + 0.031 - 19 * 0.001)
    model = replace(chat(), cost=cost)
    _, fleet = simulate(SimConfig(models={"chat": model}),
                        [Arrival(0.0, "chat", prompt_tokens=18, output_tokens=5)],
                        keep_requests=True)
    assert fleet.requests is not None
    (req,) = fleet.requests
    assert req.first_token_s == pytest.approx(0.030)
    assert (req.end_s or 0) - req.first_token_s == pytest.approx(4 * 0.016)


def test_inputs_lengths_reach_the_batch_cost_and_the_planner() -> None:
    """A one-shot request's ``input_chars`` sets its batch's time (the profile's length
    fit) and is what the simulated planner plans with, as the server's: on an idle pool
    a short text goes to the accurate variant, a long one that would miss its deadline
    there to the fast one; each lone request takes its variant's batch of one at its
    length."""
    from sluice.policy.variants.service_estimator import LengthPrior

    prior = LengthPrior(slope=1.0, mean=1.0, var=0.25, typical_longest_chars=((1, 100.0),))
    models = {
        "big": SimModel("big", "oneshot", 100 * MB, 0.0, ModelCost(
            0.0, (1, 2), (0.040, 0.070), length_prior=prior), accuracy=0.9),
        "small": SimModel("small", "oneshot", 100 * MB, 0.0, ModelCost(
            0.0, (1, 2), (0.005, 0.008), length_prior=prior), accuracy=0.8)}
    config = SimConfig(models=models, groups=(SimGroup("g", ("big", "small")),),
                       preload=("big", "small"), worker=worker(1000 * MB))
    lengths = [50, 300, 100, 300]
    arrivals = [Arrival(float(i), "g", deadline_s=0.1, input_chars=n)
                for i, n in enumerate(lengths)]
    _, fleet = simulate(config, arrivals, keep_requests=True)
    assert fleet.requests is not None
    assert [r.model for r in fleet.requests] == ["big", "small", "big", "small"]
    for r, n in zip(fleet.requests, lengths, strict=True):
        assert r.status == "completed"
        batch_s = models[r.model].cost.batch_s(1, n)
        assert (r.end_s or 0) - r.arrival_s == pytest.approx(batch_s, abs=0.0051)
    assert models["big"].cost.batch_s(1, 300) == pytest.approx(0.120)


def test_a_replan_reaches_requests_waiting_in_an_inbox_and_caps_their_batch() -> None:
    """The server's dispatcher replans queued group requests in the scheduler *and* in a
    worker's inbox (``Runtime._movable``); so does the simulated replica. Eight requests
    wait in the inbox for the accurate variant while the worker runs another model (a
    batch the group's planner does not see, so it admitted them as if the worker were
    idle). When the next arrival makes the dispatcher look again, a batch of eight on
    ``big`` would end past their deadline: the replan moves members to ``small`` in
    place, which splits the inbox's run, so no batch of eight forms and they finish in
    time. (Before, the simulator replanned only the scheduler's queue, here empty: all
    eight ran as one ``big`` batch and expired.)"""
    models = {
        "slow": SimModel("slow", "oneshot", 100 * MB, 0.0, ModelCost(0.0, (1,), (0.200,))),
        "big": SimModel("big", "oneshot", 100 * MB, 0.0, ModelCost(
            0.0, (1, 8), (0.040, 0.110)), accuracy=0.9),
        "small": SimModel("small", "oneshot", 100 * MB, 0.0, ModelCost(
            0.0, (1, 8), (0.005, 0.012)), accuracy=0.8),
    }
    config = SimConfig(models=models, groups=(SimGroup("g", ("big", "small")),),
                       preload=("slow", "big", "small"),
                       worker=worker(1000 * MB, inbox_capacity=16, max_wait_s=0.005))
    arrivals = [Arrival(0.0, "slow")]
    arrivals += [Arrival(0.010 + 0.001 * i, "g", deadline_s=0.3) for i in range(8)]
    arrivals += [Arrival(0.195, "g", deadline_s=1.0)]
    _, fleet = simulate(config, arrivals, keep_requests=True)
    assert fleet.requests is not None
    waiting = fleet.requests[1:9]
    assert all(r.worker == 0 for r in waiting)
    assert max(r.batch_size for r in waiting if r.model == "big") < 8
    assert {r.model for r in waiting} == {"big", "small"}
    assert [r.status for r in waiting] == ["completed"] * 8
    # why each ran where it did, as the server's x-sluice-plan-reason: the moved ones
    # "replanned", those left on big the planner's first choice
    assert {r.plan_reason for r in waiting if r.model == "small"} == {"replanned"}
    assert all(r.plan_reason not in (None, "replanned") for r in waiting if r.model == "big")
    assert fleet.requests[0].plan_reason is None  # not a group request

    # Deadlines so close (0.203 s) that when the worker frees at 0.2 s no variant can
    # finish them: rejected ``deadline_infeasible`` out of the inbox (as the server ends
    # them), never run.
    arrivals[1:9] = [replace(a, deadline_s=0.203 - a.time_s) for a in arrivals[1:9]]
    arrivals[-1] = Arrival(0.25, "g", deadline_s=1.0)
    _, fleet = simulate(config, arrivals, keep_requests=True)
    assert fleet.requests is not None
    waiting = fleet.requests[1:9]
    assert [(r.status, r.reason, r.started_s) for r in waiting] == [
        ("rejected", "deadline_infeasible", None)] * 8
    assert fleet.requests[9].status == "completed"
    assert all(not w.inbox for rep in fleet.replicas for w in rep.workers)


def test_the_simulated_planner_starts_from_the_servers_recent_arrivals() -> None:
    """Same arrivals, same planner reasons on both sides, when the simulation starts
    from the server's state. The server's arrival meter still holds the load that went
    before (a previous load's tail, a capacity run); a simulation started with none
    reads the first seconds of the next load as far lighter than the server does, so it
    keeps the accurate variant (``low_load``) where the server already predicted
    (``meets_deadline``): in the ONNX validation, 5 to 12 requests a point. The server
    side here is the planner's own measurements (``VariantTracker``, which the server
    wraps) planning each arrival on an idle pool; its ``arrival_state`` is what
    ``/status.json`` publishes (``groups.<id>.arrivals``)."""
    models = {
        "big": SimModel("big", "oneshot", 100 * MB, 0.0, ModelCost(
            0.0, (1, 8), (0.040, 0.320)), accuracy=0.9),
        "small": SimModel("small", "oneshot", 100 * MB, 0.0, ModelCost(
            0.0, (1, 8), (0.005, 0.040)), accuracy=0.8),
    }
    group = SimGroup("g", ("big", "small"), PlannerConfig(max_batch_size=8))
    # big: 25/s, so the low-load line is 12.5/s; the load before ran at 40/s for 5 s
    # and ended 0.25 s before the next load's first arrival (one each 100 ms: 10/s)
    server = VariantTracker([GroupPlan("g", group.variants, group.planner)],
                            {v: VariantInfo(models[v].accuracy, 1, dict(zip(
                                models[v].cost.batch_sizes, models[v].cost.batch_times_s,
                                strict=True))) for v in group.variants})
    before_s = [100.0 + 0.025 * i for i in range(200)]
    for t in before_s:
        server.plan("g", None, t)
    start_s = before_s[-1] + 0.25
    published = server.arrival_state(start_s)["g"]
    arrivals = [Arrival(0.100 * i, "g", deadline_s=2.0) for i in range(60)]
    reasons = []
    for rid, a in enumerate(arrivals, start=1000):
        choice = server.plan("g", start_s + a.time_s + a.deadline_s, start_s + a.time_s)
        assert choice is not None and choice.variant is not None
        reasons.append(choice.reason)
        # an idle pool at every arrival (big's batch of one ends 40 ms after it)
        server.admitted(rid, choice.variant, start_s + a.time_s + a.deadline_s, "g")
        server.started(rid)
        server.finished(rid, choice.variant)
    assert reasons[0] == "meets_deadline" and "low_load" in reasons  # the carried load fades

    def simulated(config: SimConfig) -> list[str | None]:
        _, fleet = simulate(config, arrivals, keep_requests=True)
        assert fleet.requests is not None
        assert all(r.batch_size == 1 for r in fleet.requests)  # the pool idle, as above
        return [r.plan_reason for r in fleet.requests]

    config = SimConfig(models=models, groups=(group,), preload=("big", "small"),
                       worker=worker(1000 * MB))
    assert simulated(config.with_arrivals({"g": {"arrivals": published}})) == reasons
    fresh = simulated(config)
    assert fresh[0] == "low_load" and fresh != reasons  # started from none, as before


@pytest.mark.parametrize(("keep_alive", "reloads"), [
    (KeepAlive(idle_s=1.0), True), (STAY, False), (PINNED, False)])
def test_a_model_idle_past_its_keep_alive_is_loaded_again(keep_alive: KeepAlive,
                                                          reloads: bool) -> None:
    """The simulated worker lets an idle model go by the server's keep-alive rule: a
    request 0.5 s after the last finds it loaded; one 5 s later pays the load again."""
    model = replace(oneshot("a"), keep_alive=keep_alive)
    config = SimConfig(models={"a": model}, workers=1, preload=(),
                       worker=worker(max_wait_s=0.0))
    arrivals = [Arrival(0.0, "a"), Arrival(0.5, "a"), Arrival(5.0, "a")]
    _, fleet = simulate(config, arrivals, keep_requests=True)
    assert fleet.requests is not None
    first, soon, late = sorted(fleet.requests, key=lambda r: r.arrival_s)
    batch_s = 0.005
    assert first.end_s == pytest.approx(0.05 + batch_s)  # loaded on first use
    assert soon.end_s - soon.arrival_s == pytest.approx(batch_s)
    expected = 0.05 + batch_s if reloads else batch_s
    assert late.end_s - late.arrival_s == pytest.approx(expected)


def test_simulated_speculation_drafts_through_the_servers_policy() -> None:
    """A model that drafts (``SimDrafting``, the acceptance the server measured): a lone
    request verifies drafts on the planner's choice and finishes in fewer, longer steps;
    every request still gets exactly its tokens. At acceptance 0 drafting stops after
    the first rejections but for a probe now and then."""
    from sluice.sim.engine import SimDrafting

    step = StepCost(0.010, 0.002, 0.0001)
    arrivals = [Arrival(0.0, "chat", prompt_tokens=40, output_tokens=64)]

    def run(drafting: SimDrafting | None) -> tuple[float, int, int, int]:
        model = replace(chat(step=step), drafting=drafting)
        report, fleet = simulate(SimConfig(models={"chat": model}, workers=1), arrivals,
                                 keep_requests=True)
        assert fleet.requests is not None
        (req,) = fleet.requests
        assert req.generated == 64 and report["overall"]["states"] == {"completed": 1}
        engine = fleet.replicas[0].workers[0].engines["chat"]
        return (req.end_s or 0) - (req.first_token_s or 0), engine.steps, \
            engine.draft_tokens, engine.accepted_tokens
    plain_s, plain_steps, drafted, _ = run(None)
    assert drafted == 0
    fast_s, fast_steps, drafted, accepted = run(SimDrafting(0.9))
    assert accepted > 0 and drafted >= accepted and fast_steps < plain_steps
    assert fast_s < plain_s
    _, _, drafted, accepted = run(SimDrafting(0.0))
    assert accepted == 0 and 0 < drafted < 0.4 * 64  # the first tries, then rare probes


def test_a_cost_entrys_draft_acceptance_makes_an_auto_model_draft() -> None:
    from sluice.sim.engine import SimDrafting
    from tests.server.live import config_with, synth_chat

    def drafting(**model: object) -> SimDrafting | None:
        config = config_with(models=[{**synth_chat(), **model}])
        sim = SimConfig.from_config(config, {"synth-chat": {"draft_acceptance": 0.7}})
        return sim.models["synth-chat"].drafting
    assert drafting(draft_max=4) == SimDrafting(0.7, 4)
    assert drafting(speculation="off") is None
    config = config_with(models=[synth_chat()])
    assert SimConfig.from_config(config).models["synth-chat"].drafting is None
    with pytest.raises(ValueError, match="acceptance"):
        SimDrafting(1.5)


def test_the_queue_is_the_runtimes_own_settings() -> None:
    """The replica's control core is built from the ``QueueConfig`` the runtime's is: the
    file's ``[scheduling]`` and the tenants' weights reach both through one object."""
    from tests.server.live import config_with

    config = config_with(
        models=[{"id": "enc", "kind": "oneshot", "backend": "synthetic",
                 "memory_bytes": 1_000_000}],
        scheduling={"scheduler": "wfq", "router": "least_loaded", "queue_capacity": 7,
                    "bypass_threshold": 3},
        tenants=[{"id": "a", "weight": 2.0}, {"id": "b"}])
    expected = QueueConfig(scheduler="wfq", bypass_threshold=3, router="least_loaded",
                           queue_capacity=7, tenant_weights={"a": 2.0, "b": 1.0})
    assert config.runtime_config().queue == expected
    sim = SimConfig.from_config(config)
    assert sim.queue == expected
    assert sim.worker == config.runtime_config().workers[0]
    assert sim.capacity_per_replica == 7 + sim.workers * sim.worker.inbox_capacity
    with pytest.raises(ValueError, match="queue_capacity must be >= 1, got 0"):
        QueueConfig(queue_capacity=0)
    with pytest.raises(ValueError, match="inbox_capacity must be >= 1, got 0"):
        worker(inbox_capacity=0)


def test_closed_loop_clients_each_keep_one_request_in_flight() -> None:
    """One client on a lone model: each request starts when the one before ended, so the
    run takes their summed service times; two clients on two slots run two at once and
    read twice the tokens per second of one (a decode step costs the same at 1 and 2)."""
    step = StepCost(0.01, 0.0, 0.0001, 0.0)
    config = SimConfig(models={"chat": chat(step=step)}, preload=("chat",))
    requests = [Arrival(0.0, "chat", prompt_tokens=10, output_tokens=20)] * 6
    one, fleet = simulate_closed_loop(config, requests, clients=1, keep_requests=True)
    assert fleet.requests is not None
    alone = step.predict_s(0, 10) + 19 * step.predict_s(1, 0)
    for before, after in itertools.pairwise(fleet.requests):
        assert after.arrival_s == pytest.approx(before.end_s or 0)
    assert fleet.recorder.last_end_s == pytest.approx(6 * alone)
    assert one["tokens"] == 6 * 20
    assert one["tokens_per_s"] == pytest.approx(120 / (6 * alone), rel=1e-3)
    two, _ = simulate_closed_loop(config, requests, clients=2)
    assert two["overall"]["states"] == {"completed": 6}
    assert two["tokens_per_s"] == pytest.approx(2 * one["tokens_per_s"], rel=0.05)


def test_closed_loop_refused_clients_ask_again_and_every_request_ends_once() -> None:
    """More clients than the queue holds: the refused ones send their next request at
    once; every request still ends exactly once and the completed ones count tokens."""
    config = fleet_config(workers=1, queue_capacity=1, inbox_capacity=1)
    requests = [Arrival(0.0, "chat", prompt_tokens=10, output_tokens=8)] * 40
    report, fleet = simulate_closed_loop(config, requests, clients=12, keep_requests=True)
    assert fleet.requests is not None and len(fleet.requests) == 40
    states = report["overall"]["states"]
    assert sum(states.values()) == 40 and states.get("rejected", 0) > 0
    assert report["tokens"] == 8 * states["completed"]
    with pytest.raises(ValueError, match="clients"):
        simulate_closed_loop(config, requests, clients=0)


def test_a_warm_up_leaves_its_prefixes_and_is_not_counted() -> None:
    """Requests run before the loop (``warm``) are forgotten once they end: the report
    and the kept requests are the loop's alone, its time starts when they ended, and the
    loop's first request finds its prompt retained (a prefix copy instead of a prefill)."""
    step = StepCost(0.01, 0.0, 0.001, 0.0)
    config = SimConfig(models={"chat": chat(step=step)}, preload=("chat",))
    ask = Arrival(0.0, "chat", prompt_tokens=200, output_tokens=20, prefix_id=3,
                  prefix_tokens=200)
    cold, cold_fleet = simulate_closed_loop(config, [ask], clients=1, keep_requests=True)
    warm, fleet = simulate_closed_loop(config, [ask], clients=1, keep_requests=True,
                                       warm=[replace(ask, output_tokens=1)])
    assert fleet.requests is not None and cold_fleet.requests is not None
    assert len(fleet.requests) == 1 and warm["requests"] == 1 and warm["tokens"] == 20
    (first,), (cold_first,) = fleet.requests, cold_fleet.requests
    assert first.arrival_s > 0  # after the warm-up's request ended
    assert (first.first_token_s or 0) - first.arrival_s < (
        (cold_first.first_token_s or 0) - cold_first.arrival_s - 0.1)  # 199 of 200 reused
    assert warm["tokens_per_s"] > cold["tokens_per_s"]
