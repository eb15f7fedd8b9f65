"""The supervisor's decisions as plain functions and on fake workers, and fault injection,
without threads."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest

from sluice.backends.base import ModelSpec
from sluice.backends.faults import FaultInjector, FaultPlan, WorkerKilled
from sluice.backends.synthetic import SyntheticBackend
from sluice.engine.observer import Observer
from sluice.engine.supervisor import Supervisor, stalled, worker_status
from sluice.engine.worker import Heartbeat
from sluice.engine.worker.types import WorkerFault


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


class _DeadWorker:
    """A worker that died with a load the control side has not applied yet: its published
    residency is empty until ``apply_pending`` (the pump's work) runs."""

    def __init__(self) -> None:
        self.config = SimpleNamespace(worker_id=3)
        self.state = SimpleNamespace(resident=frozenset())
        self.fault = WorkerFault("died", "traceback", 1.0)
        self.abandoned = self.stopped_on_purpose = False

    def apply_pending(self) -> None:
        self.state = SimpleNamespace(resident=frozenset({"m"}))

    def is_alive(self) -> bool:
        return False

    def abandon(self, reason: str) -> None:
        self.abandoned = True

    def close_models(self) -> None:
        pass


class _Replacement:
    def __init__(self) -> None:
        self.loaded: list[str] = []

    def ready(self) -> Future[None]:
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def load(self, model_id: str) -> Future[None]:
        self.loaded.append(model_id)
        return self.ready()


def test_a_dead_workers_residency_is_read_after_its_last_messages_are_applied() -> None:
    """The replacement loads what the dead worker held by its last message, not what the
    control side had applied when the death was noticed (a load's ``State`` still on the
    outbox): the supervisor reads residency only after ``applied`` returns."""
    dead, replacement = _DeadWorker(), _Replacement()
    applied: list[int] = []

    def apply(worker: Any) -> bool:
        worker.apply_pending()
        applied.append(worker.config.worker_id)
        return True

    sup = Supervisor(lambda: [dead], lambda i: replacement, lambda wid, msg: 0, apply,
                     lambda: 2.0, Observer(), poll_s=1.0)
    sup.check()
    assert applied == [3] and replacement.loaded == ["m"]
    sup.check()  # its loads are done: the recovery is recorded with the model
    [recovery] = sup.recoveries
    assert recovery.models == ("m",) and recovery.worker_id == 3
