"""The slot table: admissions, retirements and moves applied to free, retained, running and
held slots and the KV allocator, with its invariants checked after every change."""

from __future__ import annotations

import pytest

from sluice.policy.step.slot_table import SlotOps, SlotTable
from sluice.policy.step.step_data import Admission, EngineConfig, PrefixCopy, StepView, WaitingSeq
from sluice.policy.step.step_planner import plan_step


def table(n_slots: int = 4, unified: bool = False, **config: object) -> SlotTable:
    cfg = EngineConfig(kv_block_tokens=8, min_prefix_tokens=4, **config)  # type: ignore[arg-type]
    return SlotTable.for_context(cfg, n_ctx_tokens=64 * n_slots, n_slots=n_slots,
                                 unified=unified)


def kinds(t: SlotTable) -> list[str]:
    t.check_integrity()
    return [e.kind for e in t.layout()]


def test_free_slots_go_out_lowest_first_whatever_order_they_came_back_in() -> None:
    t = table()
    for rid in (1, 2, 3):
        t.apply(Admission(rid, t.free_slots[0], 16, None))
    assert kinds(t) == ["running", "running", "running", "free"]
    assert t.retire(2) == (2,)
    assert t.retire(0) == (0,)
    assert t.free_slots == (0, 2, 3)
    assert kinds(t) == ["free", "running", "free", "free"]
    assert t.kv.free_blocks == t.kv.total_blocks - 2


def test_an_admission_takes_its_slots_and_reserves_its_kv_in_each() -> None:
    t = table()
    ops = t.apply(Admission(7, 1, 20, None, fork_slots=(2, 3)))
    assert ops == SlotOps(clear=(1, 2, 3), prefix=None)
    assert [(e.kind, e.request_id) for e in t.layout()] == [
        ("free", None), ("running", 7), ("held", 7), ("held", 7)]
    assert t.kv.free_blocks == t.kv.total_blocks - 3 * 3
    t.fork(2)
    assert t.kind(2) == "running"
    with pytest.raises(ValueError, match="not held"):
        t.fork(1)
    kinds(t)


def test_a_completed_sequence_keeps_its_prefix_and_a_later_prompt_starts_in_it() -> None:
    t = table()
    t.apply(Admission(1, 0, 24, None))
    assert t.retire(0, [5, 6, 7, 8, 9], n_fed=5, tenant="a") == ()  # kept, nothing to clear
    assert kinds(t)[0] == "retained"
    assert t.kv.free_blocks == t.kv.total_blocks  # its blocks went back
    [kept] = t.retained()
    assert (kept.slot, tuple(kept.tokens), kept.tenant, kept.kv_blocks) == (
        0, (5, 6, 7, 8, 9), "a", 0)
    # a prompt sharing part of it copies that part out: the slot stays retained
    view = StepView((), (WaitingSeq(2, (5, 6, 7, 8, 1), 8, 0.0, tenant="a"),),
                    t.free_slots, t.kv.snapshot(), 0.0, t.retained())
    [adm] = plan_step(t.config, view).admissions
    assert adm.slot == 1 and not adm.in_place and adm.prefix == PrefixCopy(0, 4)
    # one that continues all of it starts in it
    view = StepView((), (WaitingSeq(2, (5, 6, 7, 8, 9, 1), 8, 0.0, tenant="a"),),
                    t.free_slots, t.kv.snapshot(), 0.0, t.retained())
    [adm] = plan_step(t.config, view).admissions
    assert adm.in_place and adm.prefix == PrefixCopy(0, 5)
    ops = t.apply(adm)
    assert ops.clear == () and ops.prefix == PrefixCopy(0, 5)  # trimmed in place, not cleared
    assert kinds(t) == ["running", "free", "free", "free"]


def test_a_short_sequence_or_one_that_did_not_complete_is_not_retained() -> None:
    t = table()
    t.apply(Admission(1, 0, 24, None))
    t.apply(Admission(2, 1, 24, None))
    assert t.retire(0, [1, 2, 3], n_fed=3) == (0,)  # under min_prefix_tokens
    assert t.retire(1) == (1,)
    assert kinds(t) == ["free"] * 4


def test_past_the_cap_the_least_recently_used_retained_slot_is_dropped() -> None:
    t = table(max_retained_slots=2)
    for rid in range(3):
        t.apply(Admission(rid, rid, 16, None))
    t.retire(1, list(range(10)), n_fed=10)
    t.retire(0, list(range(10)), n_fed=10)
    assert t.retire(2, list(range(10)), n_fed=10) == (1,)  # oldest dropped: clear it
    assert [r.slot for r in t.retained()] == [0, 2]
    assert kinds(t) == ["retained", "free", "retained", "free"]


def test_handing_out_and_evicting_retained_slots_clears_them() -> None:
    t = table(n_slots=2, unified=True)
    for rid in (0, 1):
        t.apply(Admission(rid, rid, 40, None))
        t.retire(rid, list(range(40)), n_fed=40)
    assert [r.kv_blocks for r in t.retained()] == [5, 5]  # lent pool blocks
    ops = t.apply(Admission(5, 1, 100, None, evict=(0,)))
    assert ops.clear == (0, 1)  # the evicted slot, then the one handed out
    assert kinds(t) == ["free", "running"]


def test_moves_bring_running_sequences_down_and_retained_prefixes_up() -> None:
    t = table()
    for rid in range(3):
        t.apply(Admission(rid, rid, 16, None))
    t.retire(0, list(range(10)), n_fed=10)
    assert [(m.src, m.dst) for m in t.moves(2)] == [(0, 3), (2, 0)]
    for m in t.moves(2):
        t.move(m.src, m.dst)
    assert [(e.kind, e.request_id) for e in t.layout()] == [
        ("running", 2), ("running", 1), ("free", None), ("retained", None)]
    assert t.kv.block_table(0) and not t.kv.block_table(2)  # the blocks moved with it
    kinds(t)
    with pytest.raises(ValueError, match="not free"):
        t.move(0, 1)


def test_no_moves_with_one_unified_cache() -> None:
    t = table(unified=True)
    t.apply(Admission(1, 3, 16, None))
    assert t.moves(2) == []


def test_adopt_forget_and_bad_input() -> None:
    t = table()
    assert t.adopt(2, [1, 2, 3, 4], "b") == ()
    assert t.entry(2).tokens == [1, 2, 3, 4] and t.entry(2).tenant == "b"
    with pytest.raises(ValueError, match="not free"):
        t.adopt(2, [1], "b")
    assert tuple(t.forget(2) or ()) == (1, 2, 3, 4)
    assert t.forget(2) is None
    with pytest.raises(ValueError, match=r"outside 0\.\.3"):
        t.kind(4)
    with pytest.raises(ValueError, match="runs no sequence"):
        t.retire(1)
    kinds(t)


def test_a_stale_admission_changes_nothing() -> None:
    t = table()
    t.apply(Admission(1, 0, 16, None))
    with pytest.raises(RuntimeError, match=r"stale plan.*slot 0, which is running"):
        t.apply(Admission(2, 0, 16, None))
    with pytest.raises(RuntimeError, match="stale plan"):
        t.apply(Admission(3, 1, 10_000, None))  # more KV than there is
    with pytest.raises(RuntimeError, match="evicts slot 2"):
        t.apply(Admission(4, 1, 16, None, evict=(2,)))
    assert kinds(t) == ["running", "free", "free", "free"]
    assert t.kv.sequences() == [0]


def test_check_integrity_finds_a_broken_table() -> None:
    t = table()
    t.apply(Admission(1, 0, 16, None))
    t.kv.free(0)  # KV freed behind the table's back
    with pytest.raises(RuntimeError, match="KV blocks are owned"):
        t.check_integrity()
