"""Keeping running sequences on the lowest KV streams: the moves ``compaction_moves``
decides, and the invariants of applying them."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sluice.policy.step.slot_layout import SlotMove, compaction_moves


def test_the_highest_running_sequence_fills_the_lowest_hole() -> None:
    assert compaction_moves({0, 5}, (), {1, 2, 3, 4, 6, 7}, 4) == [SlotMove(5, 1)]


def test_a_packed_layout_needs_no_move() -> None:
    assert compaction_moves({0, 1, 2}, (5,), {3, 4, 6, 7}, 4) == []
    assert compaction_moves((), (0, 1), {2, 3}, 4) == []


def test_a_retained_prefix_in_the_way_moves_above_the_running_ones_first() -> None:
    # slot 1 retains a prefix below running 2: it goes to the top free slot, 2 comes down
    assert compaction_moves({0, 2}, (1,), {3, 4, 5, 6, 7}, 4) == [SlotMove(1, 7), SlotMove(2, 1)]


def test_a_retained_prefix_with_no_room_above_stays_and_so_does_its_hole() -> None:
    assert compaction_moves({0, 2}, (1,), set(), 4) == []
    # the budget cannot pay for both moves: the free hole further up still fills
    assert compaction_moves({0, 3}, (1,), {2, 4}, 1) == [SlotMove(3, 2)]


def test_moves_are_capped() -> None:
    moves = compaction_moves({4, 5, 6, 7}, (), {0, 1, 2, 3}, 2)
    assert moves == [SlotMove(7, 0), SlotMove(6, 1)]


def test_held_slots_are_neither_moved_nor_filled() -> None:
    # slot 1 is held for a request's later choice: in none of the collections
    assert compaction_moves({0, 3}, (), {2}, 4) == [SlotMove(3, 2)]


@st.composite
def layouts(draw: st.DrawFn) -> tuple[set[int], list[int], set[int], int]:
    n = draw(st.integers(1, 12))
    kinds = draw(st.lists(st.sampled_from("rtfh"), min_size=n, max_size=n))
    running = {s for s, k in enumerate(kinds) if k == "r"}
    retained = [s for s, k in enumerate(kinds) if k == "t"]
    free = {s for s, k in enumerate(kinds) if k == "f"}
    return running, retained, free, draw(st.integers(0, 6))


@given(layouts())
def test_applying_the_moves_keeps_every_invariant(layout: tuple[set[int], list[int],
                                                                 set[int], int]) -> None:
    running, retained, free, budget = layout
    run, ret, empty = set(running), set(retained), set(free)
    top = max(run, default=-1)
    moves = compaction_moves(running, retained, free, budget)
    assert len(moves) <= budget
    for m in moves:
        assert m.dst in empty and (m.src in run or m.src in ret)
        if m.src in ret:
            assert m.dst > max(run)
            ret.remove(m.src)
            ret.add(m.dst)
        else:
            assert m.dst < m.src
            run.remove(m.src)
            run.add(m.dst)
        empty.remove(m.dst)
        empty.add(m.src)
        assert max(run, default=-1) <= top
    assert len(run) == len(running) and len(ret) == len(retained)
    if len(moves) < budget - 1 and run:
        # budget left: no free slot is below a running one any more
        assert not any(s < max(run) for s in empty)
