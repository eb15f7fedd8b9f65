"""The length prior: measured by ``sluice profile`` from its own batches, carried in the
served config, and the server's service estimate sizes its first batches by it."""

from __future__ import annotations

import pytest

from sluice.backends.base import ModelSpec
from sluice.engine.variants import length_prior, variant_info
from sluice.prep.profile import length_fit


def test_length_fit_recovers_the_slope_of_the_profiles_batches() -> None:
    # batch 1: 20 ms + 0.25 ms a character; batch 4: twice that; means 50 ms / 100 ms
    longest = {1: [20, 120, 220], 4: [20, 120, 220]}
    times = {1: [0.025, 0.050, 0.075], 4: [0.050, 0.100, 0.150]}
    fit = length_fit(times, longest)
    assert fit is not None
    # observed / mean grows by 0.5 per 100 characters at both batch sizes
    assert fit["slope_per_char"] == pytest.approx(0.005)
    assert fit["mean_chars"] == pytest.approx(120.0)
    assert fit["var_chars"] == pytest.approx(20000 / 3, rel=1e-3)
    assert fit["batches"] == 6


def test_length_fit_has_no_answer_without_differing_lengths() -> None:
    assert length_fit({1: [0.05, 0.06]}, {1: [100, 100]}) is None
    assert length_fit({1: [0.05]}, {1: [100]}) is None
    assert length_fit({1: [0.05, 0.06]}, {1: [100]}) is None  # misaligned: not used
    # shorter is never faster in the prior: a negative fit is clipped to 0
    fit = length_fit({1: [0.06, 0.04]}, {1: [10, 100]})
    assert fit is not None and fit["slope_per_char"] == 0.0


def test_the_served_config_carries_the_prior_to_the_planner() -> None:
    opts = {"service_ms": {"1": 50.0}, "accuracy": 0.9,
            "length_prior": {"slope_per_char": 0.005, "mean_chars": 120.0, "var_chars": 6667.0}}
    spec = ModelSpec(model_id="m", kind="oneshot", backend="onnx", memory_bytes=1, options=opts)
    info = variant_info(spec, [1 << 40])
    assert info.length_prior == length_prior(spec)
    assert info.length_prior is not None and info.length_prior.slope_per_char == 0.005
    bare = ModelSpec(model_id="m", kind="oneshot", backend="onnx", memory_bytes=1,
                     options={"service_ms": {"1": 50.0}})
    assert length_prior(bare) is None
