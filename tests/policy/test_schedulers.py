"""Schedulers: hand-built cases and random operation sequences against the reference."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.policy.queues.scheduler import SCHEDULER_NAMES, Scheduler, make_scheduler
from sluice.policy.types import QueueItem

from ._reference import ReferenceScheduler


def item(rid: int, model: str = "m", *, tenant: str = "default", priority: int = 5,
         deadline_s: float | None = None, cost: int = 1) -> QueueItem:
    return QueueItem(rid, model, float(rid), tenant, priority, deadline_s, cost)


def drain(s: Scheduler) -> list[int]:
    out = []
    while (popped := s.pop(0.0)) is not None:
        out.append(popped.request_id)
    return out


def test_fifo_oldest_first() -> None:
    s = make_scheduler("fifo")
    for rid in (1, 2, 3, 4):
        s.push(item(rid))
    assert s.remove(2) is not None
    assert s.remove(2) is None
    assert len(s) == 3 and 3 in s and 2 not in s
    assert drain(s) == [1, 3, 4]
    assert s.pop(0.0) is None


def test_fifo_item_pushed_back_keeps_its_place() -> None:
    s = make_scheduler("fifo")
    for rid in (1, 2, 3):
        s.push(item(rid))
    first = s.pop(0.0)
    assert first is not None
    s.push(first)  # e.g. every worker inbox was full
    assert drain(s) == [1, 2, 3]


def test_priority_edf_order() -> None:
    s = make_scheduler("priority_edf")
    s.push(item(1, priority=5))
    s.push(item(2, priority=1, deadline_s=None))
    s.push(item(3, priority=1, deadline_s=50.0))
    s.push(item(4, priority=1, deadline_s=10.0))
    s.push(item(5, priority=0))
    s.push(item(6, priority=1, deadline_s=10.0))
    assert drain(s) == [5, 4, 6, 3, 2, 1]


def test_priority_edf_remove_is_lazy_but_exact() -> None:
    s = make_scheduler("priority_edf")
    for rid in range(100):
        s.push(item(rid, priority=rid % 3))
    for rid in range(0, 100, 2):
        assert s.remove(rid) is not None
    assert drain(s) == sorted(range(1, 100, 2), key=lambda r: (r % 3, r))


@pytest.mark.parametrize("name", SCHEDULER_NAMES)
def test_duplicate_push_is_refused(name: str) -> None:
    s = make_scheduler(name)
    s.push(item(1))
    with pytest.raises(ValueError, match="request_id 1"):
        s.push(item(1))
    assert len(s) == 1


def test_make_scheduler_validation() -> None:
    with pytest.raises(ValueError, match="'lifo'"):
        make_scheduler("lifo")
    with pytest.raises(ValueError, match="bypass_threshold"):
        make_scheduler("fifo", bypass_threshold=-1)
    with pytest.raises(ValueError, match="'gold'"):
        make_scheduler("fifo", tenant_weights={"gold": 0.0})
    assert [make_scheduler(n).name for n in SCHEDULER_NAMES] == list(SCHEDULER_NAMES)


# Operations: ("push", model, tenant, priority, deadline, cost) | ("pop",) | ("remove", k)
# | ("repush", k) | ("served", tenant, tokens). k indexes into known ids (queued or not).
MODELS = st.sampled_from(["a", "b", "c", "d"])
TENANTS = st.sampled_from(["t1", "t2", "t3"])
PUSH = st.tuples(st.just("push"), MODELS, TENANTS, st.integers(0, 3),
                 st.one_of(st.none(), st.integers(0, 5).map(float)), st.integers(1, 20))
POP = st.tuples(st.just("pop"))
REMOVE = st.tuples(st.just("remove"), st.integers(0, 1000))
REPUSH = st.tuples(st.just("repush"), st.integers(0, 1000))
SERVED = st.tuples(st.just("served"), TENANTS, st.integers(-10, 30))


def run_against_reference(name: str, ops: list[tuple[Any, ...]], *,
                          bypass_threshold: int = 2) -> None:
    weights = {"t1": 3.0, "t2": 1.0}
    s = make_scheduler(name, bypass_threshold=bypass_threshold, tenant_weights=weights)
    ref = ReferenceScheduler(name, bypass_threshold, weights)
    known: list[QueueItem] = []
    popped: list[int] = []
    for op in ops:
        kind = op[0]
        if kind == "push":
            _, model, tenant, priority, deadline, cost = op
            new = QueueItem(len(known), model, 0.0, tenant, priority, deadline, cost)
            known.append(new)
            s.push(new)
            ref.push(new)
        elif kind == "pop":
            got = s.pop(0.0)
            want = ref.pop()
            assert got == want
            if got is not None:
                popped.append(got.request_id)
        elif kind == "remove" and known:
            rid = known[op[1] % len(known)].request_id
            assert s.remove(rid) == ref.remove(rid)
        elif kind == "repush" and known:
            again = known[op[1] % len(known)]
            if again.request_id not in ref.ids():
                s.push(again)
                ref.push(again)
        elif kind == "served":
            s.on_served(op[1], op[2])
            ref.on_served(op[1], op[2])
        assert len(s) == len(ref.queued)
        assert all(i.request_id in s for i in ref.queued)
    # Drain: the same picks to the end, and nothing left behind.
    while ref.queued:
        assert s.pop(0.0) == ref.pop()
    assert s.pop(0.0) is None and len(s) == 0


@pytest.mark.parametrize("name", ["fifo", "priority_edf", "wfq"])
@settings(max_examples=150, deadline=None)
@given(ops=st.lists(st.one_of(PUSH, PUSH, POP, REMOVE, REPUSH, SERVED), max_size=120))
def test_matches_reference_with_any_push_order(name: str, ops: list[tuple[Any, ...]]) -> None:
    """fifo, priority_edf and wfq pick exactly what the reference picks, including when
    already-popped requests are pushed back out of order."""
    run_against_reference(name, ops)


HOT_PUSH = st.tuples(st.just("push"), st.just("a"), TENANTS, st.just(5), st.none(), st.just(1))


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.one_of(PUSH, HOT_PUSH, POP, POP, REMOVE), min_size=10, max_size=150),
       threshold=st.integers(0, 3))
def test_workload_aware_matches_reference(ops: list[tuple[Any, ...]], threshold: int) -> None:
    """With ids pushed in increasing order, workload_aware picks exactly what a reference with
    explicit per-request skip counters picks (its oldest-only check is exact)."""
    run_against_reference("workload_aware", ops, bypass_threshold=threshold)


@pytest.mark.parametrize("name", SCHEDULER_NAMES)
@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.one_of(PUSH, PUSH, POP, REMOVE, REPUSH), max_size=150))
def test_nothing_lost_or_duplicated(name: str, ops: list[tuple[Any, ...]]) -> None:
    """Every pushed request leaves exactly once, by pop or remove, whatever the order."""
    s = make_scheduler(name, bypass_threshold=1)
    known: list[QueueItem] = []
    queued: set[int] = set()
    for op in ops:
        if op[0] == "push":
            new = QueueItem(len(known), str(op[1]), 0.0, str(op[2]))
            known.append(new)
            s.push(new)
            queued.add(new.request_id)
        elif op[0] == "pop":
            got = s.pop(0.0)
            assert (got is None) == (not queued)
            if got is not None:
                queued.remove(got.request_id)
        elif op[0] == "remove" and known:
            rid = known[op[1] % len(known)].request_id
            assert (s.remove(rid) is not None) == (rid in queued)
            queued.discard(rid)
        elif op[0] == "repush" and known:
            again = known[op[1] % len(known)]
            if again.request_id not in queued:
                s.push(again)
                queued.add(again.request_id)
        assert len(s) == len(queued)
    assert sorted(drain(s)) == sorted(queued)
