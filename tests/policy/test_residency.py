"""Residency: victim orders, in-use protection, budget invariants under random operations."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.policy.capacity.residency import LoadPlan, Residency


def loaded(eviction: str, budget: int, models: list[tuple[str, int, float, float, int]]
           ) -> Residency:
    """models: (id, bytes, load_cost_s, last_used_s, use_count)."""
    r = Residency(budget, eviction)
    for model_id, size, cost, last_used, uses in models:
        r.commit_load(model_id, size, cost, now=0.0)
        for _ in range(uses):
            r.acquire(model_id, now=0.0)
            r.release(model_id, now=0.0)
        r.release(model_id, now=last_used)  # sets last_used_s; in_use stays 0
    r.check_integrity()
    return r


def test_lru_evicts_least_recently_used_first() -> None:
    r = loaded("lru", 100, [("a", 30, 1.0, 5.0, 0), ("b", 30, 1.0, 2.0, 0),
                            ("c", 30, 1.0, 9.0, 0)])
    plan = r.plan_load("d", 50)
    assert plan is not None and plan.victims == ("b", "a")


def test_lru_ties_break_on_model_id() -> None:
    r = loaded("lru", 60, [("y", 30, 1.0, 1.0, 0), ("x", 30, 1.0, 1.0, 0)])
    plan = r.plan_load("z", 30)
    assert plan is not None and plan.victims == ("x",)


def test_cost_aware_lexicographic_order() -> None:
    # (load_cost_s asc, use_count asc, memory_bytes desc, last_used_s asc, model_id)
    models = [
        ("expensive", 10, 9.0, 0.0, 0),
        ("cheap_popular", 10, 1.0, 0.0, 5),
        ("cheap_small", 10, 1.0, 0.0, 1),
        ("cheap_big", 20, 1.0, 8.0, 1),
        ("cheap_big_old", 20, 1.0, 3.0, 1),
        ("cheap_big_old2", 20, 1.0, 3.0, 1),
    ]
    r = loaded("cost_aware", 90, models)
    plan = r.plan_load("new", 90)
    assert plan is not None
    assert plan.victims == ("cheap_big_old", "cheap_big_old2", "cheap_big", "cheap_small",
                            "cheap_popular", "expensive")
    # Only as many victims as needed: 30 bytes of room needs 20 + 20 (free is 0).
    partial = r.plan_load("new", 30)
    assert partial is not None and partial.victims == ("cheap_big_old", "cheap_big_old2")


def test_in_use_model_is_never_a_victim() -> None:
    r = loaded("lru", 100, [("a", 50, 1.0, 0.0, 0), ("b", 50, 1.0, 5.0, 0)])
    r.acquire("a", now=10.0)  # now the most recently used too; make it oldest again:
    r.acquire("b", now=11.0)
    r.release("b", now=12.0)
    plan = r.plan_load("c", 50)
    assert plan is not None and plan.victims == ("b",)
    assert r.plan_load("c", 60) is None  # would need a, which is in use
    with pytest.raises(ValueError, match="in use"):
        r.evict("a")
    r.release("a", now=13.0)
    plan = r.plan_load("c", 60)
    assert plan is not None and plan.victims == ("b", "a")


def test_plan_load_simple_cases() -> None:
    r = Residency(100)
    assert r.plan_load("a", 101) is None and not r.can_ever_hold(101)
    assert r.plan_load("a", 40) == LoadPlan("a", (), "fits free memory (100 of 40 bytes)")
    r.commit_load("a", 40, 2.0, now=0.0)
    assert r.plan_load("a", 40) == LoadPlan("a", (), "already resident")
    assert (r.resident_bytes, r.free_bytes) == (40, 60)


def test_commit_load_and_errors() -> None:
    r = Residency(100, eviction="cost_aware")
    r.commit_load("a", 60, 1.0, now=1.0)
    with pytest.raises(ValueError, match="free_bytes"):
        r.commit_load("b", 50, 1.0, now=1.0)
    with pytest.raises(ValueError, match="already resident"):
        r.commit_load("a", 10, 1.0, now=1.0)
    with pytest.raises(ValueError, match="not resident"):
        r.acquire("zzz", now=1.0)
    with pytest.raises(ValueError, match="eviction"):
        Residency(10, eviction="random")
    with pytest.raises(ValueError, match="budget_bytes"):
        Residency(-1)


def test_acquire_release_bookkeeping() -> None:
    r = Residency(100)
    r.commit_load("a", 10, 1.0, now=1.0)
    r.acquire("a", now=2.0)
    r.acquire("a", now=3.0)
    r.release("a", now=4.0)
    [model] = r.models()
    assert (model.in_use, model.use_count, model.last_used_s) == (1, 2, 4.0)
    model.in_use = 99  # a copy: the residency is unchanged
    r.release("a", now=5.0)
    r.release("a", now=6.0)  # never below 0
    assert r.models()[0].in_use == 0
    assert r.evictable_bytes == 10
    r.evict("a")
    assert not r.is_resident("a") and r.resident_bytes == 0


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("load"), st.sampled_from("abcdefg"), st.integers(0, 60),
                  st.floats(0, 10)),
        st.tuples(st.just("acquire"), st.sampled_from("abcdefg")),
        st.tuples(st.just("release"), st.sampled_from("abcdefg")),
        st.tuples(st.just("evict"), st.sampled_from("abcdefg")),
    ),
    max_size=120,
)


@settings(max_examples=200, deadline=None)
@given(ops=OPS, eviction=st.sampled_from(["lru", "cost_aware"]), budget=st.integers(0, 150))
def test_random_operations_keep_budget_and_spare_models_in_use(
    ops: list[tuple[Any, ...]], eviction: str, budget: int
) -> None:
    r = Residency(budget, eviction)
    in_use: dict[str, int] = {}
    for step, op in enumerate(ops):
        now = float(step)
        kind, model_id = op[0], op[1]
        if kind == "load":
            size, cost = op[2], op[3]
            plan = r.plan_load(model_id, size)
            if plan is None:
                assert not r.is_resident(model_id)
                assert size > budget or size > r.free_bytes + r.evictable_bytes
                continue
            assert all(in_use.get(v, 0) == 0 for v in plan.victims)
            for victim in plan.victims:
                r.evict(victim)
            if not r.is_resident(model_id):
                r.commit_load(model_id, size, cost, now)
        elif kind == "acquire" and r.is_resident(model_id):
            r.acquire(model_id, now)
            in_use[model_id] = in_use.get(model_id, 0) + 1
        elif kind == "release" and r.is_resident(model_id):
            r.release(model_id, now)
            in_use[model_id] = max(0, in_use.get(model_id, 0) - 1)
        elif kind == "evict" and r.is_resident(model_id):
            if in_use.get(model_id, 0) > 0:
                with pytest.raises(ValueError):
                    r.evict(model_id)
            else:
                r.evict(model_id)
                in_use.pop(model_id, None)
        r.check_integrity()
        assert 0 <= r.resident_bytes <= budget
        for model in r.models():
            assert model.in_use == in_use.get(model.model_id, 0)
