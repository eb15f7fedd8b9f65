"""The runtime plans from the queue and re-plans queued requests as time passes: driven
step by step with a hand-moved clock and the threads not started (nothing runs, so the
queue only ages)."""

from __future__ import annotations

from sluice.backends.base import ModelSpec
from sluice.backends.synthetic import SyntheticBackend
from sluice.engine.request import Request, RequestStatus
from sluice.engine.runtime import Runtime, RuntimeConfig
from sluice.engine.variants import GroupSpec
from sluice.policy.variants.planner import PlannerConfig
from sluice.policy.worker_config import WorkerConfig


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def spec(model_id: str, accuracy: float, ms_per_item: float) -> ModelSpec:
    return ModelSpec(model_id, "oneshot", "synthetic", 10_000_000, task="classification",
                     options={"accuracy": accuracy, "load_s": 0.0,
                              "service_ms": {"1": ms_per_item, "8": 8 * ms_per_item}})


def runtime(clock: Clock) -> Runtime:
    models = (spec("big", 0.9, 30.0), spec("small", 0.8, 1.0))
    group = GroupSpec("g", ("big", "small"), PlannerConfig(max_batch_size=8))
    cfg = RuntimeConfig(models=models, workers=(WorkerConfig(0, 10**9),), groups=(group,))
    return Runtime(cfg, {"synthetic": SyntheticBackend()}, clock=clock)


def submit(rt: Runtime, model: str, deadline_in_s: float) -> Request:
    req = rt.new_request(model, input="x", deadline_s=rt.clock() + deadline_in_s)
    assert rt.try_submit(req) is None
    return req


DEADLINE_S = 0.125
"""Three 30 ms requests (one 90 ms batch) fit with the cold planner's prior error margin
(25 % of the prediction + 10 ms, so 115 ms); a fourth (120 ms) does not."""


def replan(rt: Runtime) -> None:
    with rt._cv:
        rt._replan_queued(rt.clock())


def test_queued_requests_move_to_a_faster_variant_or_fail_early() -> None:
    clock = Clock()
    rt = runtime(clock)
    # An empty queue at a low rate: accurate-only's choice; the queue then decides.
    reqs = [submit(rt, "g", DEADLINE_S) for _ in range(3)]
    assert [r.model_id for r in reqs] == ["big", "big", "big"]  # one batch: 90 ms
    assert rt.variants.last_choice["g"].reason == "low_load"
    fourth = submit(rt, "g", DEADLINE_S)  # joining would make the batch 120 ms
    assert fourth.model_id == "small"
    assert rt.variants.last_choice["g"].reason == "backlog"
    named = submit(rt, "big", DEADLINE_S)  # a variant named directly is never moved

    clock.now += 0.050  # nothing ran: the 90 ms batch, with its margin, now ends late
    replan(rt)
    assert [r.model_id for r in reqs] == ["small", "small", "big"]
    snapshot = rt.variants.snapshot()
    assert (snapshot["big"]["in_system"], snapshot["small"]["in_system"]) == (2, 3)
    assert all(r.status == RequestStatus.QUEUED for r in [*reqs, fourth, named])

    clock.now += DEADLINE_S - 0.0505  # 0.5 ms left: no variant can finish anything in time
    replan(rt)
    for r in [*reqs, fourth]:
        assert r.status == RequestStatus.REJECTED
        assert r.final is not None and r.final.error_code == "deadline_infeasible"
    assert named.status == RequestStatus.QUEUED and named.model_id == "big"
    assert len(rt._scheduler) == 1


def test_requests_in_a_worker_inbox_are_moved_by_that_worker() -> None:
    clock = Clock()
    rt = runtime(clock)
    reqs = [submit(rt, "g", DEADLINE_S) for _ in range(3)]
    with rt._cv:
        rt._dispatch(clock.now)  # all three into the (idle, unstarted) worker's inbox
    worker = rt.workers[0]
    assert len(rt._scheduler) == 0 and worker.inbox_depth() == 3

    clock.now += 0.050
    replan(rt)
    replan(rt)  # a move already asked for is not asked again
    # The worker makes the moves on its own thread, between batches: not yet.
    assert [r.model_id for r in reqs] == ["big", "big", "big"]
    assert len(worker._controls) == 2
    worker._handle_controls()  # what the worker thread does next
    rt.drain_outbox()  # what the pump applies of its answers
    assert [r.model_id for r in reqs] == ["small", "small", "big"]
    assert not rt._moving
    snapshot = rt.variants.snapshot()
    assert (snapshot["big"]["in_system"], snapshot["small"]["in_system"]) == (1, 2)


def test_the_planner_learns_the_longest_input_of_each_batch() -> None:
    clock = Clock()
    rt = runtime(clock)
    reqs = [rt.new_request("big", input="x" * n, deadline_s=clock.now + 1.0)
            for n in (40, 300, 120)]
    for r in reqs:
        assert rt.try_submit(r) is None
    assert rt.variants.tracker.length_of == {r.request_id: len(r.input) for r in reqs}
    for r in reqs[:2]:  # the worker marks a batch's members running, then reports it
        assert r.mark_running(clock.now)
    rt.variants.batch_started(0, "big", 2)
    assert rt.variants.tracker.running[0][1:] == (2, clock.now, 300)
    assert list(rt.variants.tracker.length_of) == [reqs[2].request_id]
    clock.now += 0.5
    rt.variants.batch_done("big", 2, 0.5, worker_id=0)
    assert rt.variants.service["big"].length.samples == 1
