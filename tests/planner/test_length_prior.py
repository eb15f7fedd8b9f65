"""The length prior: measured by ``sluice profile`` from its own batches, carried in the
served config, and the server's service estimate sizes its first batches by it."""

from __future__ import annotations

import json

import pytest

from sluice.backends.base import ModelSpec
from sluice.engine.variants import length_prior, variant_info
from sluice.policy.variants.service_estimator import LengthPrior, ServiceEstimator
from sluice.prep.profile import length_fit


def test_length_fit_recovers_the_slope_of_the_profiles_batches() -> None:
    # time = 20 ms + 0.25 ms a character of the longest input, ×2 at batch 4; batch 4's
    # longest inputs are longer (mean 150, not 100) at no cost over its own curve
    longest = {1: [20, 100, 180], 4: [50, 150, 250]}
    times = {1: [0.025, 0.045, 0.065], 4: [0.065, 0.115, 0.165]}
    fit = length_fit(times, longest)
    assert fit is not None
    assert fit["typical_longest_chars"] == {"1": 100.0, "4": 150.0}
    # in units of each size's typical longest input, both sizes lie on one line through
    # (1, 1): batch 1 rises 0.556 per unit (25 → 65 ms of a 45 ms mean from 0.2 to 1.8),
    # batch 4 0.652; pooled, weighted by their spread of lengths, 0.595
    assert fit["mean"] == pytest.approx(1.0)
    assert fit["slope"] == pytest.approx(0.595, abs=0.001)
    assert fit["batches"] == 6


def test_sizing_by_the_typical_longest_input_keeps_the_batch_1_slope() -> None:
    """In characters, pooled over sizes, batch 4's longer inputs at ratio 1 flatten the
    line; per unit of each size's typical input the batch-1 prediction keeps its slope."""
    longest = {1: [20, 100, 180], 4: [100, 200, 300]}
    times = {1: [0.025, 0.045, 0.065], 4: [0.090, 0.090, 0.090]}  # 4: flat, long inputs
    fit = length_fit(times, longest)
    assert fit is not None
    prior = LengthPrior(fit["slope"], fit["mean"], fit["var"],
                        tuple((int(b), c) for b, c in fit["typical_longest_chars"].items()))
    est = ServiceEstimator({1: 0.045, 4: 0.090}, length_prior=prior)
    assert est.batch_s(1, longest=100) == pytest.approx(0.045)
    assert est.batch_s(4, longest=200) == pytest.approx(0.090)
    assert est.batch_s(1, longest=180) > est.batch_s(1, longest=100) * 1.1


def test_length_fit_has_no_answer_without_differing_lengths() -> None:
    assert length_fit({1: [0.05, 0.06]}, {1: [100, 100]}) is None
    assert length_fit({1: [0.05]}, {1: [100]}) is None
    assert length_fit({1: [0.05, 0.06]}, {1: [100]}) is None  # misaligned: not used
    # shorter is never faster in the prior: a negative fit is clipped to 0
    fit = length_fit({1: [0.06, 0.04]}, {1: [10, 100]})
    assert fit is not None and fit["slope"] == 0.0


def test_the_served_config_carries_the_prior_to_the_planner() -> None:
    prior = {"slope": 0.6, "mean": 1.0, "var": 0.4,
             "typical_longest_chars": {"8": 200.0, "1": 100.0}}
    opts = {"service_ms": {"1": 50.0}, "accuracy": 0.9, "length_prior": prior}
    spec = ModelSpec(model_id="m", kind="oneshot", backend="onnx", memory_bytes=1, options=opts)
    info = variant_info(spec, [1 << 40])
    assert info.length_prior == length_prior(spec)
    assert info.length_prior == LengthPrior(0.6, 1.0, 0.4, ((1, 100.0), (8, 200.0)))
    # a config written by an older profile: lengths in characters
    old = {"slope_per_char": 0.005, "mean_chars": 120.0, "var_chars": 6667.0}
    spec = ModelSpec(model_id="m", kind="oneshot", backend="onnx", memory_bytes=1,
                     options={**opts, "length_prior": old})
    assert length_prior(spec) == LengthPrior(0.005, 120.0, 6667.0)
    bare = ModelSpec(model_id="m", kind="oneshot", backend="onnx", memory_bytes=1,
                     options={"service_ms": {"1": 50.0}})
    assert length_prior(bare) is None


def test_an_estimator_restored_from_anothers_state_predicts_what_it_predicts() -> None:
    """``state`` is plain JSON; a fresh estimator with the same profile and prior that
    ``restore``s it gives the same batch times at every size and length, in either
    direction from the profile, and keeps learning from there."""
    prior = LengthPrior(0.4, 1.0, 0.3, ((1, 100.0), (8, 240.0)))
    for speed in (0.8, 1.3):  # a machine faster, then slower, than the profile
        live = ServiceEstimator({1: 0.04, 8: 0.2}, length_prior=prior)
        for i in range(40):
            chars = 50 + 10 * (i % 20)
            live.observe(1 + i % 8, speed * live.profiled_batch_s(1 + i % 8) * chars / 150,
                         chars)
        copy = ServiceEstimator({1: 0.04, 8: 0.2}, length_prior=prior)
        copy.restore(json.loads(json.dumps(live.state())))
        for n, chars in ((1, 0), (1, 80), (4, 200), (8, 400), (11, 30)):
            assert copy.batch_s(n, chars) == pytest.approx(live.batch_s(n, chars))
        assert (copy.batch_s(1) < 0.04) == (speed < 1)
        live.observe(2, 0.5, 120)
        copy.observe(2, 0.5, 120)
        assert copy.batch_s(3, 150) == pytest.approx(live.batch_s(3, 150))
