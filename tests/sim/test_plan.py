"""Capacity planning: the objective, the search for the fewest replicas, the autoscaling
target."""

from __future__ import annotations

import dataclasses

import pytest

from sluice.policy.queues.control_core import QueueConfig
from sluice.policy.step.step_cost import StepCost
from sluice.sim import SimConfig, SimModel, generate, parse_spec, simulate
from sluice.sim.costs import ModelCost
from sluice.sim.plan import Slo, fewest_replicas, parse_slo, plan, waiting_target

CHAT = SimModel("chat", "generative", 500_000_000, 1.0,
                ModelCost(0.0, step=StepCost(0.02, 0.0005, 0.0001)), n_seq_max=8,
                n_ctx_total=4096)
CONFIG = SimConfig(models={"chat": CHAT}, queue=QueueConfig(queue_capacity=32),
                   replica_router="least_loaded")
SPEC = parse_spec("poisson:rate=60,duration=30,model=chat,prompt=20,output=16")


def test_slo_parses_units_and_names_bad_parts() -> None:
    assert parse_slo("ttft_p95=2s,goodput=0.99") == Slo(ttft_p95_s=2.0, goodput=0.99)
    assert parse_slo("e2e_p95=250ms") == Slo(e2e_p95_s=0.25)
    with pytest.raises(ValueError, match="tpot"):
        parse_slo("tpot=1")
    with pytest.raises(ValueError, match="not a number"):
        parse_slo("ttft_p95=fast")


def test_fewest_replicas_is_the_smallest_that_meets_the_objective() -> None:
    arrivals = list(generate(SPEC, 3))
    slo = Slo(ttft_p95_s=0.3, goodput=0.99)
    n, summary, misses, runs = fewest_replicas(CONFIG, arrivals, slo, 32)
    assert n is not None and n > 1 and not misses and runs <= 2 * 6
    below, _ = simulate(dataclasses.replace(CONFIG, replicas=n - 1), arrivals)
    assert slo.misses(below)
    at, _ = simulate(dataclasses.replace(CONFIG, replicas=n), arrivals)
    assert not slo.misses(at) and summary["ttft_p95_s"] == at["overall"]["ttft_s"]["p95"]


def test_plan_ranks_by_replicas_and_reports_the_unmeetable() -> None:
    arrivals = list(generate(SPEC, 3))
    out = plan(CONFIG, arrivals, Slo(ttft_p95_s=0.3), schedulers=["fifo", "priority_edf"],
               max_replicas=16)
    assert [c.replicas for c in out] == sorted(c.replicas or 99 for c in out)
    never = plan(CONFIG, arrivals, Slo(ttft_p95_s=0.001), max_replicas=4)
    assert never[0].replicas is None and never[0].misses


def test_waiting_target_grows_with_the_objective() -> None:
    tight = waiting_target(CONFIG, SPEC, replicas=4, ttft_p95_s=0.5, requests=600)
    loose = waiting_target(CONFIG, SPEC, replicas=4, ttft_p95_s=2.0, requests=600)
    assert 0 <= tight["target_waiting_per_replica"] < loose["target_waiting_per_replica"]
    rows = loose["ttft_p95_s_by_waiting"]
    assert rows and rows[-1]["ttft_p95_s"] > rows[0]["ttft_p95_s"]
