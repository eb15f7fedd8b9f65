"""Cross-replica routers: rankings are permutations; residency, then prefix homes within a
load bound, then least loaded; round robin rotates; avoided replicas go last."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.policy.queues.replica_router import (
    REPLICA_ROUTER_NAMES,
    AffinityReplicaRouter,
    HashRing,
    ReplicaRequest,
    ReplicaView,
    load_bound,
    make_replica_router,
    prefix_fingerprint,
)

GB = 1 << 30
SYSTEM = "You are a careful assistant for the billing team. " * 8


def view(rid: str, ongoing: int = 0, *, capacity: int = 8, resident: tuple[str, ...] = (),
         free: int = 0, draining: bool = False) -> ReplicaView:
    return ReplicaView(rid, ongoing, capacity, frozenset(resident), free, draining)


def req(prefix: str | None = None, *, model: str = "m", model_bytes: int = GB,
        exclude: tuple[str, ...] = ()) -> ReplicaRequest:
    key = None if prefix is None else prefix_fingerprint(model, prefix, 64)
    return ReplicaRequest(model, model_bytes, key, frozenset(exclude))


def test_fingerprint_keys_the_shared_prefix_only() -> None:
    a = prefix_fingerprint("m", SYSTEM + "What is my balance?", 256)
    b = prefix_fingerprint("m", SYSTEM + "Close my account.", 256)
    assert a is not None and a == b
    assert prefix_fingerprint("other", SYSTEM, 256) != a  # the model is part of the key
    assert prefix_fingerprint("m", "x" + SYSTEM, 256) != a
    assert prefix_fingerprint("m", "short prompt", 256) is None
    with pytest.raises(ValueError, match="prefix_chars"):
        prefix_fingerprint("m", SYSTEM, 0)


def test_resident_replica_wins_over_an_idle_one() -> None:
    replicas = [view("r1", 5, resident=("m",)), view("r2", 0, free=8 * GB),
                view("r3", 0, free=0, resident=("x",))]
    ranking = AffinityReplicaRouter().rank(req(), replicas)
    assert ranking.ranked == ("r1", "r2", "r3")
    assert ranking.reasons["r1"].startswith("resident, least loaded, load 5/8")
    assert "fits free memory" in ranking.reasons["r2"]
    assert "needs eviction" in ranking.reasons["r3"]


def test_same_prefix_goes_home_different_prefixes_spread() -> None:
    router = AffinityReplicaRouter()
    replicas = [view(f"r{i}", resident=("m",)) for i in range(4)]
    homes = {router.rank(req(SYSTEM + f"question {q}"), replicas).first for q in range(20)}
    assert len(homes) == 1  # one system prompt, one home
    spread = Counter(router.rank(req(f"{p:04d} " + SYSTEM), replicas).first for p in range(200))
    assert len(spread) == 4 and min(spread.values()) >= 20  # distinct prefixes use all four


def test_home_over_the_load_bound_spills_along_the_ring() -> None:
    router = AffinityReplicaRouter(load_factor=1.25)
    idle = [view(f"r{i}", resident=("m",)) for i in range(3)]
    home = router.rank(req(SYSTEM), idle).first
    assert home is not None
    ring = HashRing([v.replica_id for v in idle], router.vnodes).walk(req(SYSTEM).prefix_key or "")
    assert ring[0] == home
    # The home holds 4, the others 1 each: bound = ceil(1.25 × 7 / 3) = 3 < 4 + 1.
    loaded = [view(v.replica_id, 4 if v.replica_id == home else 1, resident=("m",))
              for v in idle]
    ranking = router.rank(req(SYSTEM), loaded)
    assert ranking.first == ring[1]
    assert f"prefix spill from {home}" in ranking.reasons[ring[1]]
    assert "bound 3" in ranking.reasons[ring[1]]
    assert ranking.ranked[1:] == (ring[0], ring[2])  # the rest in ring order


def test_a_home_that_cannot_take_the_request_is_named_as_the_spill_source() -> None:
    """The home is a property of the key and the replica set, not of who has room: a
    retry that excludes the refusing home, or a full / draining home, still names it."""
    router = AffinityReplicaRouter()
    idle = [view(f"r{i}", resident=("m",)) for i in range(3)]
    ring = HashRing([v.replica_id for v in idle], router.vnodes).walk(req(SYSTEM).prefix_key or "")
    home = ring[0]
    cases = {
        "it refused this request": (idle, (home,)),
        "draining": ([view(v.replica_id, resident=("m",), draining=v.replica_id == home)
                      for v in idle], ()),
        "full, load 8/8": ([view(v.replica_id, 8 if v.replica_id == home else 0,
                                 resident=("m",)) for v in idle], ()),
        "needs eviction": ([view(v.replica_id, resident=() if v.replica_id == home else ("m",))
                            for v in idle], ()),
    }
    for why, (replicas, exclude) in cases.items():
        ranking = router.rank(req(SYSTEM, exclude=exclude), replicas)
        assert ranking.first == ring[1], why  # the next on the ring, as before
        assert ranking.reasons[ring[1]].startswith(
            f"resident, prefix spill from {home} ({why})"), ranking.reasons[ring[1]]
        assert ranking.ranked[-1] == home or why == "needs eviction"
    # With the home open again the key goes back to it.
    assert router.rank(req(SYSTEM), idle).first == home


def test_adding_a_replica_moves_only_keys_it_takes() -> None:
    keys = [f"key-{i}" for i in range(300)]
    before = HashRing(["a", "b", "c"], 64)
    after = HashRing(["a", "b", "c", "d"], 64)
    moved = [k for k in keys if before.walk(k)[0] != after.walk(k)[0]]
    assert all(after.walk(k)[0] == "d" for k in moved)
    assert 0 < len(moved) < len(keys) / 2


def test_full_and_avoided_replicas_go_last() -> None:
    replicas = [view("r1", 8, resident=("m",)), view("r2", 1, draining=True),
                view("r3", 2), view("r4", 0)]
    for name in REPLICA_ROUTER_NAMES:
        ranking = make_replica_router(name).rank(req(SYSTEM, exclude=("r4",)), replicas)
        assert ranking.ranked == ("r3", "r1", "r4", "r2"), name  # avoided: by load
        assert ranking.reasons["r1"].startswith("full")
        assert ranking.reasons["r2"].startswith("avoided")


def test_only_avoided_replicas_are_still_ranked() -> None:
    ranking = AffinityReplicaRouter().rank(req(exclude=("r1",)), [view("r1")])
    assert ranking.ranked == ("r1",)


def test_round_robin_rotates_over_open_replicas() -> None:
    router = make_replica_router("round_robin")
    replicas = [view("b"), view("a"), view("c", 8)]
    firsts = [router.rank(req(), replicas).first for _ in range(4)]
    assert firsts == ["a", "b", "a", "b"]
    assert router.rank(req(), [view("a"), view("b"), view("c")]).first == "c"


def test_least_loaded_orders_by_load_then_id() -> None:
    ranking = make_replica_router("least_loaded").rank(
        req(SYSTEM), [view("b", 1), view("a", 1), view("c", 0)])
    assert ranking.ranked == ("c", "a", "b")


def test_bad_inputs_name_the_field() -> None:
    with pytest.raises(ValueError, match="capacity"):
        view("r", capacity=0)
    with pytest.raises(ValueError, match="load_factor"):
        AffinityReplicaRouter(load_factor=0.5)
    with pytest.raises(ValueError, match="unique"):
        AffinityReplicaRouter().rank(req(), [view("r"), view("r")])
    with pytest.raises(ValueError, match="'random'"):
        make_replica_router("random")


VIEWS = st.lists(
    st.builds(lambda rid, ongoing, cap, res, draining: view(
        f"r{rid}", min(ongoing, cap + 2), capacity=cap, resident=("m",) if res else (),
        free=GB if rid % 2 else 0, draining=draining),
        st.integers(0, 9), st.integers(0, 12), st.integers(1, 8), st.booleans(),
        st.booleans()),
    max_size=7, unique_by=lambda v: v.replica_id)


@given(replicas=VIEWS, name=st.sampled_from(REPLICA_ROUTER_NAMES),
       prefix=st.sampled_from([None, SYSTEM, "7" + SYSTEM]),
       exclude=st.sets(st.sampled_from([f"r{i}" for i in range(10)]), max_size=2))
def test_rankings_are_permutations_with_reasons(
    replicas: list[ReplicaView], name: str, prefix: str | None, exclude: set[str],
) -> None:
    request = req(prefix, exclude=tuple(exclude))
    ranking = make_replica_router(name).rank(request, replicas)
    ids = sorted(r.replica_id for r in replicas)
    assert sorted(ranking.ranked) == ids
    assert set(ranking.reasons) == set(ids)
    by_id = {r.replica_id: r for r in replicas}
    classes = [0 if by_id[rid].has_room and not by_id[rid].draining and rid not in exclude
               else 2 if by_id[rid].draining or rid in exclude else 1
               for rid in ranking.ranked]
    assert classes == sorted(classes)  # open, then full, then avoided
    if name == "affinity" and classes and classes[0] == 0:
        first = by_id[ranking.ranked[0]]
        open_views = [r for r, c in zip(ranking.ranked, classes, strict=True) if c == 0]
        resident_open = [rid for rid in open_views if "m" in by_id[rid].resident]
        if resident_open:
            assert "m" in first.resident  # residency comes before load and prefix
            if prefix is not None:
                pool = [by_id[rid] for rid in resident_open]
                bound = load_bound(sum(r.ongoing for r in pool), len(pool), 1.25)
                assert first.ongoing + 1 <= bound


@given(total=st.integers(0, 1000), n=st.integers(1, 40),
       factor=st.floats(1.0, 3.0))
def test_some_replica_is_always_within_the_bound(total: int, n: int, factor: float) -> None:
    # The least loaded of n replicas holding `total` holds at most floor(total / n).
    assert total // n + 1 <= load_bound(total, n, factor)
    assert load_bound(total, n, factor) >= math.ceil((total + 1) / n)
