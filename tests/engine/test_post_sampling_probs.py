"""The distribution after the sampler chain (``post_chain_probs``): what llama-server's
``post_sampling_probs`` reports, checked against hand computations and against the draws
``sample_token`` makes from the same row."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from sluice.engine.chooser import TokenChooser
from sluice.engine.request import SamplingParams, TokenProb
from sluice.engine.sampling import SamplingError, post_chain_probs, sample_token

PROBS = np.array([0.5, 0.2, 0.15, 0.1, 0.05])
ROW = np.log(PROBS).astype(np.float32)


def probs_of(top: tuple[TokenProb, ...]) -> dict[int, float]:
    return {t.token_id: t.prob for t in top}


def test_no_filter_reports_the_softmax_most_likely_first() -> None:
    prob, top = post_chain_probs(ROW, SamplingParams(temperature=1.0), 3, 20)
    assert [t.token_id for t in top] == [0, 1, 2, 3, 4]
    assert [t.prob for t in top] == pytest.approx(list(PROBS), rel=1e-6)
    assert prob == pytest.approx(0.1, rel=1e-6)


def test_top_k_renormalises_over_the_kept_candidates() -> None:
    prob, top = post_chain_probs(ROW, SamplingParams(temperature=1.0, top_k=3), 1, 10)
    assert probs_of(top) == pytest.approx({0: 0.5 / 0.85, 1: 0.2 / 0.85, 2: 0.15 / 0.85})
    assert sum(t.prob for t in top) == pytest.approx(1.0)
    assert prob == pytest.approx(0.2 / 0.85)
    # a token the chain dropped has probability 0
    assert post_chain_probs(ROW, SamplingParams(temperature=1.0, top_k=3), 4, 10)[0] == 0.0


def test_top_p_keeps_the_smallest_set_holding_the_mass() -> None:
    # 0.5, 0.7, 0.85: the third reaches 0.8
    _, top = post_chain_probs(ROW, SamplingParams(temperature=1.0, top_p=0.8), 0, 10)
    assert probs_of(top) == pytest.approx({0: 0.5 / 0.85, 1: 0.2 / 0.85, 2: 0.15 / 0.85})


def test_temperature_then_min_p_by_hand() -> None:
    # T = 0.5 squares the probabilities: 0.25, 0.04, 0.0225, 0.01, 0.0025 (sum 0.325);
    # min_p 0.08 keeps those at least 0.08 x 0.25 = 0.02: the first three
    params = SamplingParams(temperature=0.5, min_p=0.08)
    prob, top = post_chain_probs(ROW, params, 2, 10)
    kept = {0: 0.25, 1: 0.04, 2: 0.0225}
    total = sum(kept.values())
    assert probs_of(top) == pytest.approx({t: p / total for t, p in kept.items()}, rel=1e-5)
    assert prob == pytest.approx(0.0225 / total, rel=1e-5)


def test_fewer_than_asked_only_when_the_kept_ones_sum_to_one() -> None:
    rng = np.random.default_rng(5)
    row = rng.normal(size=50_000).astype(np.float32) * 2
    params = SamplingParams(temperature=0.8, top_k=7, top_p=0.95)
    _, top = post_chain_probs(row, params, 0, 20)
    assert 0 < len(top) <= 7
    assert sum(t.prob for t in top) == pytest.approx(1.0)
    _, ten = post_chain_probs(row, SamplingParams(temperature=1.0), 0, 10)
    assert len(ten) == 10 and sum(t.prob for t in ten) < 1.0
    assert [t.prob for t in ten] == sorted((t.prob for t in ten), reverse=True)


def test_at_most_the_logprobs_bound() -> None:
    row = np.zeros(100, dtype=np.float32)
    _, top = post_chain_probs(row, SamplingParams(temperature=1.0), 0, 50)
    assert len(top) == 20
    # ties report the lower ids first
    assert [t.token_id for t in top] == list(range(20))
    assert all(t.prob == pytest.approx(0.01) for t in top)


def test_greedy_is_a_point_mass_as_llama_server_reports_it() -> None:
    prob, top = post_chain_probs(ROW, SamplingParams(temperature=0.0), 0, 10)
    assert prob == 1.0 and top == (TokenProb(0, 1.0),)


def test_masked_tokens_are_never_reported() -> None:
    row = np.full(10, -np.inf, dtype=np.float32)
    row[[2, 7]] = [1.0, 0.0]
    prob, top = post_chain_probs(row, SamplingParams(temperature=1.0, top_k=5), 7, 10)
    e = math.e
    assert probs_of(top) == pytest.approx({2: e / (e + 1), 7: 1 / (e + 1)})
    assert prob == pytest.approx(1 / (e + 1))


def test_a_row_that_is_no_distribution_raises() -> None:
    with pytest.raises(SamplingError):
        post_chain_probs(np.array([0.0, np.nan], dtype=np.float32),
                         SamplingParams(temperature=1.0), 0, 5)


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0, top_k=3),
    SamplingParams(temperature=0.7, top_p=0.9),
    SamplingParams(temperature=1.3, min_p=0.2),
])
def test_the_reported_distribution_is_the_one_drawn_from(params: SamplingParams) -> None:
    """Draw frequencies of ``sample_token`` match ``post_chain_probs`` (4 sigma)."""
    _, top = post_chain_probs(ROW, params, 0, 20)
    expected = probs_of(top)
    n = 20_000
    rng = np.random.default_rng(3)
    counts = Counter(sample_token(ROW, params, rng) for _ in range(n))
    assert set(counts) <= set(expected)
    for token, p in expected.items():
        assert abs(counts[token] / n - p) <= 4 * math.sqrt(p * (1 - p) / n) + 1e-9


def test_a_chooser_reports_post_chain_probs_and_draws_the_same_tokens() -> None:
    """Asking for the probabilities changes nothing about which tokens are drawn."""
    base = SamplingParams(temperature=1.0, top_k=4, seed=9)
    asked = SamplingParams(temperature=1.0, top_k=4, seed=9, logprobs=True, top_logprobs=3,
                           post_sampling_probs=True)
    plain = TokenChooser(base, 9, 0, [1, 2], ROW.size, None)
    post = TokenChooser(asked, 9, 0, [1, 2], ROW.size, None)
    assert plain.plain and not post.plain and not post.wants_logprobs
    for _ in range(50):
        a = sample_token(ROW, base, plain.rng)
        pick = post.pick(ROW.copy(), ROW, float("nan"), 10)
        assert pick.token == a and pick.logprob is None
        assert len(pick.top_probs) == 3 and pick.prob == probs_of(
            post_chain_probs(ROW, asked, a, 4)[1])[a]
