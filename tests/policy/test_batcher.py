"""Dynamic batching: contiguous same-model runs only."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.policy.variants.batcher import BatchDecision, decide_batch


def run_inbox(inbox: list[str], *, max_batch_size: int = 8, max_wait_s: float = 0.01
              ) -> list[list[str]]:
    """Drive the batcher over a fixed inbox, advancing time only when it asks to wait."""
    batches: list[list[str]] = []
    enqueued = [0.0] * len(inbox)
    now = 0.0
    while inbox:
        d = decide_batch([i[0] for i in inbox], enqueued[0], now,
                         max_batch_size=max_batch_size, max_wait_s=max_wait_s)
        if d.take == 0:
            assert d.wait_until_s is not None and d.wait_until_s > now
            now = d.wait_until_s
            continue
        batches.append(inbox[: d.take])
        inbox, enqueued = inbox[d.take:], enqueued[d.take:]
    return batches


def test_seed_contiguous_run_then_next_model() -> None:
    assert run_inbox(["A1", "A2", "A3", "B1"]) == [["A1", "A2", "A3"], ["B1"]]


def test_seed_never_batches_across_another_model() -> None:
    assert run_inbox(["A1", "B1", "A2", "A3"]) == [["A1"], ["B1"], ["A2", "A3"]]


def test_full_batch_runs_at_once_and_caps_size() -> None:
    d = decide_batch(["A"] * 5, 0.0, 0.0, max_batch_size=4, max_wait_s=1.0)
    assert d == BatchDecision(4, None)


def test_waits_for_more_until_max_wait() -> None:
    assert decide_batch(["A", "A"], 10.0, 10.2, max_batch_size=4, max_wait_s=0.5) == \
        BatchDecision(0, 10.5)
    assert decide_batch(["A", "A"], 10.0, 10.5, max_batch_size=4, max_wait_s=0.5) == \
        BatchDecision(2, None)


def test_other_model_behind_the_run_means_no_wait() -> None:
    assert decide_batch(["A", "B"], 0.0, 0.0, max_batch_size=4, max_wait_s=9.0) == \
        BatchDecision(1, None)


def test_empty_inbox_and_zero_wait() -> None:
    assert decide_batch([], 0.0, 0.0, max_batch_size=4, max_wait_s=1.0) == BatchDecision(0, None)
    assert decide_batch(["A"], 0.0, 0.0, max_batch_size=4, max_wait_s=0.0) == \
        BatchDecision(1, None)


def test_validation() -> None:
    with pytest.raises(ValueError, match="max_batch_size"):
        decide_batch(["A"], 0.0, 0.0, max_batch_size=0, max_wait_s=1.0)
    with pytest.raises(ValueError, match="max_wait_s"):
        decide_batch(["A"], 0.0, 0.0, max_batch_size=1, max_wait_s=-1.0)


@given(inbox=st.lists(st.sampled_from("AB"), max_size=12), size=st.integers(1, 5),
       now=st.floats(0, 2), wait=st.floats(0, 2))
def test_take_is_a_same_model_prefix(inbox: list[str], size: int, now: float, wait: float
                                     ) -> None:
    d = decide_batch(inbox, 0.0, now, max_batch_size=size, max_wait_s=wait)
    assert 0 <= d.take <= size
    assert len(set(inbox[: d.take])) <= 1
    if d.take == 0:
        assert (d.wait_until_s is None) == (not inbox)
    else:
        assert d.wait_until_s is None
        maximal = d.take == size or d.take == len(inbox) or inbox[d.take] != inbox[0]
        assert maximal
