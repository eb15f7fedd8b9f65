"""Sampling on a logits row."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from sluice.engine.request import Final, RequestStatus, SamplingParams
from sluice.engine.runtime import Runtime
from sluice.engine.sampling import SamplingError, sample_token
from tests.engine.conftest import generative


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


# -- the whole range of well-typed values ---------------------------------------------------
# These drive ``sample_token`` and the engine through their public behaviour only, so that
# a rewrite of the sampler keeps them: no value a field's type admits may crash sampling,
# and a row that is not a distribution ends its request alone with a clear error.

ROW = np.array([1.0, 4.0, 2.0, -1.0, 3.5], dtype=np.float32)


@pytest.mark.parametrize("temperature", [1e-320, 5e-324, 1e-300, 1e-6, 0.0, -1.0,
                                         float("nan"), -float("inf")])
@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (2, 1.0), (0, 0.5), (3, 0.9)])
def test_temperatures_too_small_to_mean_anything_sample_greedily(
    temperature: float, top_k: int, top_p: float,
) -> None:
    p = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    for seed in range(5):
        assert sample_token(ROW, p, np.random.default_rng(seed)) == 1


@pytest.mark.parametrize("top_k", [5, 6, 262_144, 100_000, 10**18, -3])
def test_top_k_past_the_vocabulary_is_no_cut(top_k: int) -> None:
    logits = np.log(np.array([0.5, 0.3, 0.2, 1e-9, 1e-9], dtype=np.float32))
    rng = np.random.default_rng(0)
    draws = {sample_token(logits, SamplingParams(temperature=1.0, top_k=top_k), rng)
             for _ in range(300)}
    assert {0, 1, 2} <= draws


@pytest.mark.parametrize("top_p", [1e-300, 5e-324, 0.5, 1.0])
def test_any_top_p_in_its_range_samples_a_real_token(top_p: float) -> None:
    rng = np.random.default_rng(1)
    for temperature in (1e-5, 0.7, 2.0):
        token = sample_token(ROW, SamplingParams(temperature=temperature, top_p=top_p), rng)
        assert 0 <= token < ROW.size


def test_an_infinite_temperature_is_the_uniform_limit() -> None:
    rng = np.random.default_rng(2)
    draws = {sample_token(ROW, SamplingParams(temperature=float("inf")), rng)
             for _ in range(400)}
    assert draws == set(range(ROW.size))


def test_masked_tokens_are_never_sampled() -> None:
    logits = np.array([-np.inf, 0.0, -np.inf, 0.0], dtype=np.float32)
    rng = np.random.default_rng(3)
    for params in (SamplingParams(temperature=1.0), SamplingParams(temperature=2.0, top_k=3),
                   SamplingParams(temperature=0.5, top_p=0.99),
                   SamplingParams(temperature=float("inf"))):
        assert {sample_token(logits, params, rng) for _ in range(100)} <= {1, 3}


@pytest.mark.parametrize("row", [
    [0.0, float("nan"), 1.0], [float("nan")] * 3, [0.0, float("inf"), 1.0],
    [-float("inf")] * 3,
], ids=["one NaN", "all NaN", "+inf", "all -inf"])
@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.0), SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.8, top_k=2), SamplingParams(temperature=1.2, top_p=0.5),
    SamplingParams(temperature=float("inf")),
], ids=["greedy", "plain", "top_k", "top_p", "inf temperature"])
def test_a_row_that_is_no_distribution_raises_a_clear_sampling_error(
    row: list[float], params: SamplingParams,
) -> None:
    with pytest.raises(SamplingError, match="not a distribution"):
        sample_token(np.array(row, dtype=np.float32), params, np.random.default_rng(0))


# -- through the engine: seeds, extremes, and one bad distribution among good ones ------------

PROMPT = (3, 4, 5)


def _run(rt: Runtime, prompt: tuple[int, ...] = PROMPT, **params: Any) -> Final:
    req = rt.new_request("chat", prompt_tokens=prompt,
                         params=SamplingParams(max_tokens=params.pop("max_tokens", 6),
                                               **params))
    done: list[Final] = []
    req.listeners.append(lambda e: done.append(e) if isinstance(e, Final) else None)
    assert rt.submit(req, timeout_s=5) is None
    deadline = time.monotonic() + 10
    while not done and time.monotonic() < deadline:
        time.sleep(0.002)
    assert len(done) == 1, "the request has no terminal state"
    return done[0]


def _text(rt: Runtime, **params: Any) -> str:
    final = _run(rt, **params)
    assert final.status == RequestStatus.COMPLETED, final
    return final.text


@pytest.fixture
def chat_runtime(runtime_factory: Any) -> Runtime:
    rt: Runtime = runtime_factory([generative("chat", vocab_size=64)])
    return rt


@pytest.mark.parametrize("seed", [-1, -(2**63), 2**64 - 1, 2**64, 2**200, -(10**300), 0])
def test_every_integer_seed_is_accepted_and_reduced_to_64_bits(
    chat_runtime: Runtime, seed: int,
) -> None:
    a = _text(chat_runtime, seed=seed, temperature=1.0)
    assert a == _text(chat_runtime, seed=seed, temperature=1.0)  # same seed, same output
    assert a == _text(chat_runtime, seed=seed + 2**64, temperature=1.0)  # its low 64 bits


def test_seeds_still_matter(chat_runtime: Runtime) -> None:
    outputs = {_text(chat_runtime, seed=s, temperature=2.0, max_tokens=12) for s in range(8)}
    assert len(outputs) > 1


def test_extreme_sampling_values_serve_and_tiny_temperatures_match_greedy(
    chat_runtime: Runtime,
) -> None:
    greedy = _text(chat_runtime, temperature=0.0)
    for params in ({"temperature": 1e-320, "top_k": 5}, {"temperature": 1e-320, "top_p": 0.3},
                   {"temperature": 5e-324, "top_k": 100_000, "top_p": 1e-300}):
        assert _text(chat_runtime, **params) == greedy
    for params in ({"temperature": 2.0, "top_k": 100_000}, {"temperature": 2.0, "top_p": 1e-9},
                   {"temperature": 1.0, "top_k": 10**12, "seed": -(2**80)}):
        assert _text(chat_runtime, **params)


def test_a_non_finite_distribution_fails_that_request_alone(runtime_factory: Any) -> None:
    """After token 2 (padding: never generated) this model's logits are NaN: the request
    whose prompt ends with it fails
    with a clear error while the others in the same steps complete, and the same worker
    serves afterwards."""
    rt: Runtime = runtime_factory([generative("chat", vocab_size=64,
                                              nan_logits_after_token=2)])
    worker = rt.workers[0]
    reqs, finals = [], {}
    for i, prompt in enumerate([(3, 4, 5), (3, 4, 2), (3, 4, 6)]):
        req = rt.new_request("chat", prompt_tokens=prompt,
                             params=SamplingParams(max_tokens=8, temperature=0.0, seed=i,
                                                   ignore_eos=True))
        req.listeners.append(lambda e, i=i: finals.setdefault(i, e)
                             if isinstance(e, Final) else None)
        reqs.append(req)
    for req in reqs:
        assert rt.submit(req, timeout_s=5) is None
    deadline = time.monotonic() + 10
    while len(finals) < 3 and time.monotonic() < deadline:
        time.sleep(0.002)
    assert finals[1].status == RequestStatus.FAILED
    assert "not a distribution" in (finals[1].error or "")
    assert finals[0].status == finals[2].status == RequestStatus.COMPLETED
    assert _run(rt, temperature=0.0).status == RequestStatus.COMPLETED
    assert rt.workers[0] is worker and worker.state.active_count == 0
