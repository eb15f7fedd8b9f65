"""The supervisor's decisions as plain functions, and fault injection, without threads."""

from __future__ import annotations

import pytest

from sluice.backends.base import ModelSpec
from sluice.backends.faults import FaultInjector, FaultPlan, WorkerKilled
from sluice.backends.synthetic import SyntheticBackend
from sluice.engine.supervisor import stalled, worker_status
from sluice.engine.worker import Heartbeat


def test_stalled_needs_work_and_an_overdue_heartbeat() -> None:
    beat = Heartbeat(stamp_s=10.0, allowance_s=2.0, activity="step")
    assert not stalled(beat, holds_work=True, now=12.0)  # exactly due: not yet
    assert stalled(beat, holds_work=True, now=12.01)
    assert not stalled(beat, holds_work=False, now=100.0)  # idle: nobody waits on it


@pytest.mark.parametrize(("alive", "fault", "on_purpose", "recovering", "supervised", "want"), [
    (True, False, False, False, True, "up"),
    (True, False, False, True, True, "recovering"),  # the replacement is loading
    (False, True, False, False, True, "recovering"),  # died; the supervisor will act
    (False, True, False, False, False, "dead"),  # died and nothing supervises
    (False, False, True, False, True, "stopped"),
    (False, False, False, False, True, "dead"),
])
def test_worker_status(alive: bool, fault: bool, on_purpose: bool, recovering: bool,
                       supervised: bool, want: str) -> None:
    assert worker_status(alive, fault, on_purpose, recovering, supervised) == want


def test_faults_count_calls_across_loads_and_kill_or_hang_the_listed_ones() -> None:
    slept: list[float] = []
    injector = FaultInjector(FaultPlan(kill_on_calls=frozenset({2}),
                                       hang_on_calls=frozenset({3}), hang_s=7.0),
                             sleep=slept.append)
    spec = ModelSpec("m", "oneshot", "synthetic", 1)
    first = SyntheticBackend().load(spec)
    injector.arm(first)
    assert first.run_batch(["a"])  # call 1
    with pytest.raises(WorkerKilled):  # a BaseException: no ``except Exception`` stops it
        first.run_batch(["a"])
    second = SyntheticBackend().load(spec)  # the replacement's load: counting goes on
    injector.arm(second)
    assert second.run_batch(["a"]) and slept == [7.0]  # call 3 hangs, then runs
    assert second.run_batch(["a"]) and (injector.kills, injector.hangs) == (1, 1)


def test_random_faults_follow_the_seed() -> None:
    def kills(seed: int) -> list[int]:
        inj = FaultInjector(FaultPlan(kill_probability=0.1, seed=seed))
        out = []
        for n in range(1, 200):
            try:
                inj.before_call("forward")
            except WorkerKilled:
                out.append(n)
        return out

    assert kills(1) == kills(1) and kills(1) != kills(2)
    assert 5 <= len(kills(1)) <= 40


def test_fault_plan_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="kill_probability"):
        FaultPlan(kill_probability=1.5)
