"""The engine's step-time tally: buckets by decodes and prefill, and differences of two
snapshots (what a calibration run's cost file is)."""

from __future__ import annotations

import math

from sluice.engine.step_times import StepBucket, StepTimes, bucket_key, minus


def test_steps_are_tallied_by_decodes_and_whether_they_fed_a_prompt() -> None:
    t = StepTimes()
    t.observe(3, 0, 0.040)
    t.observe(3, 0, 0.050)
    t.observe(3, 12, 0.070)
    t.observe(0, 20, 0.030)
    t.observe(3, 0, 0.0)  # not a time: ignored
    t.observe(3, 0, math.inf)
    snap = t.snapshot()
    assert set(snap) == {"3", "3+prefill", "0+prefill"}
    assert snap["3"].steps == 2 and math.isclose(snap["3"].mean_s, 0.045)
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
