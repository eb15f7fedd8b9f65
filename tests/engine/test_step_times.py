"""The engine's step-time tally: buckets by decodes and prefill, and differences of two
snapshots (what a calibration run's cost file is)."""

from __future__ import annotations

import math

from sluice.engine.step_times import (
    StepBucket,
    StepTimes,
    bucket_key,
    from_json,
    minus,
    plus,
    recent,
    to_json,
)


def test_steps_are_tallied_by_decodes_and_whether_they_fed_a_prompt() -> None:
    t = StepTimes()
    t.observe(3, 0, 0.040, 30)
    t.observe(3, 0, 0.050, 36)
    t.observe(3, 12, 0.070)
    t.observe(0, 20, 0.030)
    t.observe(3, 0, 0.0)  # not a time: ignored
    t.observe(3, 0, math.inf)
    snap = t.snapshot()
    assert set(snap) == {"3", "3+prefill", "0+prefill"}
    assert snap["3"].steps == 2 and math.isclose(snap["3"].mean_s, 0.045)
    assert snap["3"].context_tokens == 66
    assert snap["3+prefill"] == StepBucket(1, 0.070, 12)
    assert snap["0+prefill"].prefill_tokens == 20
    assert bucket_key(5, 0) == "5" and bucket_key(5, 1) == "5+prefill"


def test_a_snapshot_is_a_copy_and_two_differ_by_the_steps_between() -> None:
    t = StepTimes()
    t.observe(2, 0, 0.030)
    t.observe(1, 0, 0.020)
    before = t.snapshot()
    t.observe(2, 0, 0.034)
    t.observe(2, 8, 0.050)
    after = t.snapshot()
    assert before["2"].steps == 1  # not changed by later steps
    window = minus(after, before)
    assert set(window) == {"2", "2+prefill"}  # "1" gained nothing
    assert window["2"].steps == 1 and math.isclose(window["2"].seconds, 0.034)
    assert window["2+prefill"] == StepBucket(1, 0.050, 8)
    assert minus(after, {}) == after


def b(steps: int, ms: float, tokens: int = 0) -> StepBucket:
    return StepBucket(steps, steps * ms / 1000.0, tokens)


def test_windows_add_and_survive_their_json() -> None:
    both = plus({"2": b(3, 30.0), "1": b(1, 15.0)}, {"2": b(1, 34.0), "2+prefill": b(2, 50.0, 9)})
    assert both["2"].steps == 4 and math.isclose(both["2"].seconds, 0.124)
    assert both["1"] == b(1, 15.0) and both["2+prefill"] == b(2, 50.0, 9)
    raw = to_json(both)
    assert list(raw) == ["1", "2", "2+prefill"] and raw["2"]["mean_ms"] == 31.0
    back = from_json(raw)
    assert back.keys() == both.keys()
    assert all(back[k].steps == both[k].steps and math.isclose(back[k].seconds, both[k].seconds)
               and back[k].prefill_tokens == both[k].prefill_tokens for k in both)


def test_a_rolling_table_takes_each_bucket_from_the_newest_windows_that_hold_enough() -> None:
    old = {"8": b(600, 47.0), "1": b(60, 14.0), "3": b(5, 37.0)}
    mid = {"8": b(170, 56.0), "1": b(8, 17.0)}
    new = {"8": b(40, 55.0), "1": b(3, 18.0), "7+prefill": b(2, 90.0, 20)}
    table = recent([old, mid, new], min_steps=30)
    assert table["8"] == b(40, 55.0)  # the newest window alone holds enough
    assert table["1"].steps == 3 + 8 + 60  # back to the oldest: the newer two hold 11
    assert table["3"] == b(5, 37.0)  # never enough: all there is
    assert table["7+prefill"] == b(2, 90.0, 20)
    assert recent([old, mid, new], min_steps=1)["1"] == b(3, 18.0)
    assert recent([], min_steps=10) == {}


def test_steps_that_verified_drafts_have_their_own_buckets_with_the_counts() -> None:
    t = StepTimes()
    t.observe(2, 0, 0.030, 40, draft_tokens=5, accepted_tokens=3)
    t.observe(2, 0, 0.034, 42, draft_tokens=2, accepted_tokens=2)
    t.observe(2, 8, 0.050, 40, draft_tokens=1, accepted_tokens=0)
    t.observe(2, 0, 0.020, 40)
    snap = t.snapshot()
    assert set(snap) == {"2", "2+draft", "2+prefill+draft"}
    assert (snap["2+draft"].draft_tokens, snap["2+draft"].accepted_tokens) == (7, 5)
    assert snap["2"].draft_tokens == 0
    raw = to_json(snap)
    assert raw["2+draft"]["draft_tokens"] == 7 and "draft_tokens" not in raw["2"]
    back = from_json(raw)["2+draft"]
    assert (back.draft_tokens, back.accepted_tokens) == (7, 5)
    window = minus(t.snapshot(), {"2+draft": StepBucket(1, 0.030, 0, 40, 5, 3)})
    assert (window["2+draft"].draft_tokens, window["2+draft"].accepted_tokens) == (2, 2)
