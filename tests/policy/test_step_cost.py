"""The step-time model: fits, non-negativity, JSON round trip, online learning."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.policy.step.step_cost import OnlineStepCost, StepCost, StepSample, fit_step_cost

TRUE = StepCost(base_s=0.009, per_decode_token_s=0.0033, per_prefill_token_s=0.0004,
                per_context_token_s=2e-6)


def _samples(cost: StepCost, n: int, noise: float, seed: int = 0) -> list[StepSample]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        d, p, c = rng.randint(0, 32), rng.choice([0, 0, 64, 256]), rng.randint(0, 8000)
        t = cost.predict_s(d, p, c) * (1 + rng.uniform(-noise, noise))
        out.append(StepSample(d, p, t, c))
    return out


def test_fit_recovers_the_coefficients_of_noiseless_steps() -> None:
    fitted = fit_step_cost(_samples(TRUE, 200, noise=0.0))
    for got, want in zip(fitted.to_json().values(), TRUE.to_json().values(), strict=True):
        assert got == pytest.approx(want, rel=1e-6, abs=1e-12)


def test_fit_predicts_within_the_noise() -> None:
    fitted = fit_step_cost(_samples(TRUE, 400, noise=0.1, seed=3))
    for d in (1, 8, 16, 32):
        assert fitted.predict_s(d, 0, 1000) == pytest.approx(TRUE.predict_s(d, 0, 1000), rel=0.05)


def test_a_negative_free_fit_is_dropped_not_kept() -> None:
    # Steps that get faster with more prefill would need a negative slope: it is clamped
    # out, and every coefficient stays >= 0.
    samples = [StepSample(4, p, 0.05 - p * 1e-5) for p in (0, 100, 200, 300)]
    fitted = fit_step_cost(samples)
    assert fitted.per_prefill_token_s == 0.0
    assert all(v >= 0 for v in fitted.to_json().values())


def test_a_feature_that_never_varies_keeps_the_fallbacks_coefficient() -> None:
    decode_only = [StepSample(d, 0, TRUE.predict_s(d, 0, 0)) for d in range(1, 33)]
    fitted = fit_step_cost(decode_only, fallback=TRUE)
    assert fitted.per_prefill_token_s == TRUE.per_prefill_token_s
    assert fitted.per_decode_token_s == pytest.approx(TRUE.per_decode_token_s, rel=1e-6)
    without = fit_step_cost(decode_only)
    assert without.per_prefill_token_s == 0.0


def test_one_token_prefills_do_not_set_the_per_prompt_token_cost() -> None:
    # Prompts restored from the cache start after one fed token; those steps carry the
    # request's start-up (20 ms here), which a slope fitted on them would charge to every
    # prompt token. With a fallback the slope is the fallback's; with a real range of
    # prompt lengths it is fitted.
    rng = random.Random(5)
    restored = [StepSample(d, rng.choice([0, 0, 0, 1]), 0.0, 500 * d) for d in range(1, 33)
                for _ in range(4)]
    samples = [StepSample(s.decode_tokens, s.prefill_tokens,
                          TRUE.predict_s(s.decode_tokens, s.prefill_tokens, s.context_tokens)
                          + (0.020 if s.prefill_tokens else 0.0), s.context_tokens)
               for s in restored]
    fitted = fit_step_cost(samples, fallback=TRUE)
    assert fitted.per_prefill_token_s == TRUE.per_prefill_token_s
    assert fit_step_cost(samples).per_prefill_token_s > 0.01  # no fallback: the noise
    varied = [*samples, *(StepSample(0, p, TRUE.predict_s(0, p, 0)) for p in (64, 128, 256))]
    assert fit_step_cost(varied, fallback=TRUE).per_prefill_token_s != TRUE.per_prefill_token_s


def test_no_samples_is_an_error() -> None:
    with pytest.raises(ValueError):
        fit_step_cost([])


@pytest.mark.parametrize("bad", [-1e-3, math.nan])
def test_negative_or_nan_coefficients_are_refused(bad: float) -> None:
    with pytest.raises(ValueError):
        StepCost(base_s=bad, per_decode_token_s=0.0, per_prefill_token_s=0.0)


def test_json_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "step_cost.json"
    TRUE.save(path)
    assert StepCost.load(path) == TRUE


@given(d=st.integers(0, 256), c=st.integers(0, 100_000),
       target_ms=st.floats(0.0, 1000.0, allow_nan=False))
def test_prefill_room_keeps_the_step_within_the_target(d: int, c: int, target_ms: float) -> None:
    step_s = target_ms / 1000
    room = TRUE.prefill_room_tokens(step_s, d, c)
    assert room >= 0
    if room > 0:
        assert TRUE.predict_s(d, room, c) <= step_s + 1e-12
    assert TRUE.predict_s(d, room + 1, c) > step_s - 1e-12


def test_online_model_starts_at_the_prior_and_follows_a_slower_machine() -> None:
    prior = StepCost(0.01, 0.001, 0.0001)
    online = OnlineStepCost(prior, window=128, refit_every=16, min_samples=32)
    assert online.current() == prior
    slower = StepCost(0.02, 0.004, 0.0004)
    for sample in _samples(slower, 160, noise=0.0, seed=5):
        online.observe(sample)
    assert online.current().predict_s(16, 64) == pytest.approx(slower.predict_s(16, 64), rel=0.01)
    assert online.samples_seen == 128


def test_online_model_ignores_non_finite_times() -> None:
    prior = StepCost(0.01, 0.001, 0.0001)
    online = OnlineStepCost(prior, min_samples=1, refit_every=1)
    online.observe(StepSample(4, 0, math.inf))
    online.observe(StepSample(4, 0, 0.0))
    assert online.samples_seen == 0
    assert online.current() == prior


def _one_batch_size_window(seed: int = 5) -> list[StepSample]:
    """What a busy engine sees for minutes: every step at 19-20 sequences, about 165 ms
    (the whole cycle, host noise included), context growing as the cohort generates."""
    rng = random.Random(seed)
    return [StepSample(rng.choice([19, 20, 20, 20]), 0, 0.165 * (1 + rng.uniform(-0.04, 0.04)),
                       20 * (20 + i)) for i in range(192)]


def test_steps_at_one_batch_size_keep_the_priors_split_of_what_they_leave_open() -> None:
    prior = StepCost(0.010, 0.003, 0.0005)
    samples = _one_batch_size_window()
    fitted = fit_step_cost(samples, fallback=prior, prior_weight=2)
    # the samples fix the step time where they are ...
    assert fitted.predict_s(20, 0, 20 * 116) == pytest.approx(0.165, rel=0.03)
    # ... and a smaller batch is predicted faster by at least the prior's per-sequence cost
    assert fitted.predict_s(10, 0, 10 * 116) <= (fitted.predict_s(20, 0, 20 * 116)
                                                 - 10 * prior.per_decode_token_s)


def test_the_online_model_admits_a_smaller_batch_after_a_window_at_one_size() -> None:
    # the regression seen under 32 clients: after a window at 20 sequences the refit said
    # "140 ms + 1.5 ms a sequence", so no batch fitted a 127 ms step, and 12 waiting
    # requests waited for the whole running cohort to end
    online = OnlineStepCost(StepCost(0.010, 0.003, 0.0005), window=192, refit_every=16)
    for sample in _one_batch_size_window():
        online.observe(sample)
    assert online.current().predict_s(12, 0, 12 * 116) < 0.85 * 0.150


def test_a_negative_prior_weight_is_an_error() -> None:
    with pytest.raises(ValueError):
        fit_step_cost(_one_batch_size_window(), fallback=TRUE, prior_weight=-1)
