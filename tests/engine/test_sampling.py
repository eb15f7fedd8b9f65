"""Sampling on a logits row."""

from __future__ import annotations

import numpy as np

from sluice.engine.request import SamplingParams
from sluice.engine.sampling import sample_token


def test_greedy_is_argmax() -> None:
    logits = np.array([0.1, 3.0, 2.0], dtype=np.float32)
    assert sample_token(logits, SamplingParams(temperature=0.0), np.random.default_rng(0)) == 1


def test_top_k_one_is_argmax_at_any_temperature() -> None:
    logits = np.random.default_rng(1).normal(size=1000).astype(np.float32)
    p = SamplingParams(temperature=1.5, top_k=1)
    assert sample_token(logits, p, np.random.default_rng(2)) == int(np.argmax(logits))


def test_tiny_top_p_is_argmax() -> None:
    logits = np.random.default_rng(3).normal(size=5000).astype(np.float32)
    p = SamplingParams(temperature=1.0, top_p=1e-6)
    assert sample_token(logits, p, np.random.default_rng(4)) == int(np.argmax(logits))


def test_seeded_sampling_is_reproducible_and_follows_probabilities() -> None:
    logits = np.log(np.array([0.7, 0.2, 0.1], dtype=np.float32))
    p = SamplingParams(temperature=1.0)
    a = [sample_token(logits, p, np.random.default_rng(7)) for _ in range(3)]
    b = [sample_token(logits, p, np.random.default_rng(7)) for _ in range(3)]
    assert a == b
    rng = np.random.default_rng(11)
    draws = np.array([sample_token(logits, p, rng) for _ in range(4000)])
    freq = np.bincount(draws, minlength=3) / draws.size
    assert np.allclose(freq, [0.7, 0.2, 0.1], atol=0.03)


def test_full_vocabulary_sampling_follows_probabilities() -> None:
    rng = np.random.default_rng(5)
    logits = np.full(262_144, -30.0, dtype=np.float32)
    logits[[10, 20, 30]] = np.log([0.5, 0.3, 0.2])
    draws = np.array([sample_token(logits, SamplingParams(temperature=1.0), rng)
                      for _ in range(1200)])
    freq = np.array([(draws == i).mean() for i in (10, 20, 30)])
    assert np.allclose(freq, [0.5, 0.3, 0.2], atol=0.045)


def test_top_p_keeps_the_smallest_set_holding_the_mass() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    rng = np.random.default_rng(9)
    draws = {sample_token(logits, SamplingParams(temperature=1.0, top_p=0.75), rng)
             for _ in range(500)}
    assert draws == {0, 1}


def test_top_p_on_a_flat_distribution_reaches_past_the_head() -> None:
    logits = np.zeros(5000, dtype=np.float32)  # uniform: the nucleus needs 4500 tokens
    rng = np.random.default_rng(3)
    draws = {sample_token(logits, SamplingParams(temperature=1.0, top_p=0.9), rng)
             for _ in range(400)}
    assert max(draws) >= 1024 or len(draws) > 300
