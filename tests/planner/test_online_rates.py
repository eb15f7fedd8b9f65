"""The runtime feeds the planner: completed batches move the service-time estimate
(EWMA), the group's arrivals and backlog move the choice."""

from __future__ import annotations

import asyncio

from sluice.backends.base import ModelSpec
from sluice.backends.synthetic import SyntheticBackend
from sluice.engine.request import Request
from sluice.engine.runtime import Runtime, RuntimeConfig
from sluice.engine.variants import GroupSpec, VariantPlanner
from sluice.policy.variants.planner import PlannerConfig
from sluice.policy.worker_config import WorkerConfig
from tests.server.live import wait_for


def spec(model_id: str, accuracy: float, profiled_ms: float, actual_s: float) -> ModelSpec:
    return ModelSpec(model_id, "oneshot", "synthetic", 10_000_000, task="classification",
                     options={"accuracy": accuracy, "batch_fixed_s": actual_s,
                              "per_item_s": 0.0, "load_s": 0.0,
                              "service_ms": {"1": profiled_ms, "8": profiled_ms}})


def runtime(low_load: float = 0.0) -> Runtime:
    models = (spec("big", 0.9, 5.0, 0.030), spec("small", 0.8, 1.0, 0.001))
    group = GroupSpec("g", ("big", "small"),
                      PlannerConfig(low_load_utilization=low_load, max_batch_size=8))
    cfg = RuntimeConfig(models=models, workers=(WorkerConfig(0, 10**9, max_wait_s=0.0),),
                        groups=(group,))
    return Runtime(cfg, {"synthetic": SyntheticBackend()})


def test_completed_batches_correct_a_wrong_profile() -> None:
    rt = runtime()
    rt.start()
    try:
        async def run() -> None:
            for _ in range(25):  # the profile says 5 ms; each batch really takes 30 ms
                final = await rt.infer("big", "x")
                assert final.error is None
        asyncio.run(run())
        est = rt.variants.service["big"]
        assert 0.020 < est.batch_s(1) < 0.040
        assert est.drift.samples == 25
        # With the corrected estimate a 20 ms deadline no longer fits "big": the planner
        # picks "small", or (when the burst above still counts as a high arrival rate, so
        # even "small" is predicted to queue past 20 ms) rejects early. Never "big".
        req = rt.new_request("g", input="x", deadline_s=rt.clock() + 0.020)
        rejection = rt.try_submit(req)
        if rejection is None:
            assert req.variant == "small"
        else:
            assert rejection.reason == "deadline_infeasible"
        big = [p for p in rt.variants.last_choice["g"].predictions if p.variant == "big"]
        assert big and big[0].service_s > 0.020
    finally:
        rt.stop(drain_timeout_s=2.0)


def test_backlog_in_the_system_is_counted_and_released() -> None:
    rt = runtime()
    rt.start()
    try:
        async def run() -> None:
            handles = [rt.open(rt.new_request("big", input=str(i))) for i in range(6)]
            assert rt.variants.snapshot()["big"]["in_system"] >= 1
            for h in handles:
                await h.result()
        asyncio.run(run())
        # the runtime's listener runs on the worker thread, after the client's
        wait_for(lambda: rt.variants.snapshot()["big"]["in_system"] == 0)
    finally:
        rt.stop(drain_timeout_s=2.0)


def test_a_started_request_counts_until_its_batch_is_reported() -> None:
    """The worker marks a batch's members running before it reports the batch: a request
    planned in between still sees the first one (queued, then running), never an idle
    pool — or two requests that arrive together would both take the accurate variant."""
    models = {m.model_id: m for m in (spec("big", 0.9, 30.0, 0.030),
                                      spec("small", 0.8, 1.0, 0.001))}
    planner = VariantPlanner([GroupSpec("g", ("big", "small"), PlannerConfig())], models,
                             [10**9], clock=lambda: 0.0)

    def arrive(rid: int) -> Request:
        req = Request(rid, "g", "oneshot", arrival_s=0.0, input="x", deadline_s=1.0)
        choice = planner.plan(req, 0.0)
        assert choice is not None
        req.mark_queued(0.0)
        planner.admitted(req, "g")
        return req

    first = arrive(1)
    assert first.plan is not None and first.plan.pool_idle
    first.worker_id = 0
    first.mark_running(0.0)  # the worker took it; its batch is not reported yet
    second = arrive(2)
    assert second.plan is not None and second.plan.pool_idle is False
    planner.batch_started(0, first.model_id, 1)
    assert 1 not in planner.tracker.pending and 0 in planner.tracker.running
    third = arrive(3)
    assert third.plan is not None and third.plan.pool_idle is False


def test_fastest_baseline_ranks_by_the_profile_alone() -> None:
    models = (spec("big", 0.9, 5.0, 0.001), spec("small", 0.8, 1.0, 0.030))
    group = GroupSpec("g", ("big", "small"), PlannerConfig(policy="fastest"))
    cfg = RuntimeConfig(models=models, workers=(WorkerConfig(0, 10**9, max_wait_s=0.0),),
                        groups=(group,))
    rt = Runtime(cfg, {"synthetic": SyntheticBackend()})
    rt.start()
    try:
        async def run() -> None:
            for _ in range(10):  # measured: "small" is now the slower one
                await rt.infer("small", "x")
                await rt.infer("big", "x")
            final = await rt.open(rt.new_request("g", input="x")).result()
            assert final.error is None
        asyncio.run(run())
        assert rt.variants.service["small"].batch_s(1) > rt.variants.service["big"].batch_s(1)
        assert rt.variants.last_choice["g"].variant == "small"
    finally:
        rt.stop(drain_timeout_s=2.0)
