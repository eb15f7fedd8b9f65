"""Sampling controls against their definitions: penalties as llama.cpp computes them, logit
bias and bans, min_p, and log-probabilities against a numpy log-softmax, alone and through
the engine on the synthetic model."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest

from sluice.engine.chooser import BatchRows, TokenChooser
from sluice.engine.logprobs import prompt_token_logprobs, row_logsumexp, top_logprobs
from sluice.engine.penalties import (
    BiasTable,
    PenaltyEdit,
    PenaltyWindow,
    apply_bias,
    apply_penalties,
)
from sluice.engine.request import Request, SamplingParams, TokenEvent
from sluice.engine.sampling import sample_token
from tests.engine.test_continuous import engine, model, request, run_to_idle


def llama_cpp_penalties(logits: np.ndarray, last_tokens: list[int], repeat: float,
                        freq: float, present: float) -> np.ndarray:
    """llama.cpp's ``llama_sampler_penalties_apply``, transcribed: for each token in the
    window with count c, divide a positive logit by ``repeat`` (multiply a negative one),
    then subtract ``c * freq + (c > 0) * present``."""
    out = logits.astype(np.float32).copy()
    for token, count in Counter(last_tokens).items():
        if out[token] <= 0:
            out[token] *= repeat
        else:
            out[token] /= repeat
        out[token] -= float(count) * freq + float(count > 0) * present
    return out


def test_penalties_match_llama_cpp_on_a_batch_of_rows() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(scale=3, size=(3, 50)).astype(np.float32)
    cases = [([1, 2, 2, 3, 3, 3, 40], 1.3, 0.5, 0.25), ([5, 5, 0], 0.8, -0.4, 1.0),
             ([7], 1.0, 0.0, 0.0)]
    edits, expected = [], []
    for row, (window, rep, freq, pres) in enumerate(cases):
        w = PenaltyWindow(64, window)
        ids, counts = w.counts()
        edits.append(PenaltyEdit(ids, counts, rep, freq, pres))
        expected.append(llama_cpp_penalties(logits[row], window, rep, freq, pres))
    got = logits.copy()
    apply_penalties(got, [0, 1, 2], edits)
    np.testing.assert_allclose(got, np.stack(expected), rtol=1e-6)


@pytest.mark.parametrize("rep", [5e-324, 1e-300, 1e-31, 1e31, 1e300])
def test_extreme_repetition_penalties_keep_rows_finite_and_ordered(rep: float) -> None:
    """A subnormal penalty would round to 0 in float32 (a division by zero), a huge one
    to inf (0 * inf): both are clamped, and what they do to the order of the penalized
    logits is what a merely large or small penalty does."""
    row = np.array([[3.0, -2.0, 0.0, 1.0, -np.inf, 5.0]], dtype=np.float32)
    ids, counts = PenaltyWindow(64, [0, 1, 2, 3, 4]).counts()
    got = row.copy()
    apply_penalties(got, [0], [PenaltyEdit(ids, counts, rep, 2.0, 2.0)])
    assert np.isneginf(got[0, 4]) and np.isfinite(np.delete(got[0], 4)).all()
    assert got[0, 5] == 5.0  # not in the window: untouched
    penalized = got[0, [0, 3, 2, 1]]  # 3 > 1 > 0 > -2 before: still in that order
    assert (np.diff(penalized) <= 0).all(), penalized


def test_the_penalty_window_keeps_the_last_n_tokens() -> None:
    w = PenaltyWindow(3, [1, 2, 2])
    w.push(3)  # the first token leaves
    assert dict(zip(*(a.tolist() for a in w.counts()), strict=True)) == {2: 2, 3: 1}
    w.push(4)
    w.push(4)
    assert dict(zip(*(a.tolist() for a in w.counts()), strict=True)) == {3: 1, 4: 2}
    off = PenaltyWindow(0, [1, 2])
    off.push(5)
    assert off.counts()[0].size == 0


def test_bias_adds_and_minus_100_bans_whatever_the_temperature() -> None:
    table = BiasTable.build(((3, 2.5), (4, -100.0), (5, -250.0), (3, 1.0)), vocab_size=8)
    row = np.zeros((1, 8), dtype=np.float32)
    apply_bias(row, [0], [table])
    assert row[0, 3] == 1.0  # the later pair for a token wins
    assert np.isneginf(row[0, 4]) and np.isneginf(row[0, 5])
    hot = SamplingParams(temperature=1e6)
    rng = np.random.default_rng(0)
    assert not {sample_token(row[0], hot, rng) for _ in range(300)} & {4, 5}
    with pytest.raises(ValueError, match="outside the vocabulary"):
        BiasTable.build(((8, 1.0),), vocab_size=8)


def test_min_p_drops_tokens_below_a_fraction_of_the_top() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    rng = np.random.default_rng(1)
    draws = {sample_token(logits, SamplingParams(temperature=1.0, min_p=0.2), rng)
             for _ in range(600)}
    assert draws == {0, 1, 2}  # 0.05 < 0.2 * 0.5
    only_top = {sample_token(logits, SamplingParams(temperature=1.0, min_p=1.0), rng)
                for _ in range(50)}
    assert only_top == {0}
    # After temperature: at T=0.5 the probabilities square, so 0.15 falls below 0.2 x top.
    cooled = {sample_token(logits, SamplingParams(temperature=0.5, min_p=0.2), rng)
              for _ in range(600)}
    assert cooled == {0, 1}


def log_softmax(row: np.ndarray) -> np.ndarray:
    row = row.astype(np.float64)
    return row - (row.max() + np.log(np.exp(row - row.max()).sum()))


def test_logprobs_are_the_raw_log_softmax() -> None:
    rows = np.random.default_rng(2).normal(scale=4, size=(4, 1000)).astype(np.float32)
    lse = row_logsumexp(rows)
    for r in range(4):
        ref = log_softmax(rows[r])
        top = top_logprobs(rows[r], float(lse[r]), 5)
        assert [t.token_id for t in top] == list(np.argsort(-ref, kind="stable")[:5])
        np.testing.assert_allclose([t.logprob for t in top], np.sort(ref)[::-1][:5], atol=1e-5)
    targets = [3, 99, 500]
    np.testing.assert_allclose(prompt_token_logprobs(rows, targets),
                               [log_softmax(rows[i])[t] for i, t in enumerate(targets)],
                               atol=1e-5)


def test_the_sampled_token_s_logprob_ignores_temperature_penalties_and_bias() -> None:
    rows = np.random.default_rng(3).normal(size=(1, 64)).astype(np.float32)
    params = SamplingParams(temperature=0.3, repetition_penalty=1.5, presence_penalty=2.0,
                            logit_bias=((7, 5.0),), logprobs=True, top_logprobs=2)
    chooser = TokenChooser(params, seed=1, choice=0, context_tokens=[1, 2, 7],
                           vocab_size=64, grammar=None)
    prepared = BatchRows.build(rows, [(chooser, 0)])
    work = prepared.work[0]
    assert work is not None and work[7] != rows[0, 7]  # the sampler's copy is edited
    pick = chooser.pick(work, rows[0], float(prepared.lse[0]), tokens_left=10)
    ref = log_softmax(rows[0])
    assert pick.logprob == pytest.approx(ref[pick.token], abs=1e-5)
    assert [t.token_id for t in pick.top_logprobs] == list(np.argsort(-ref)[:2])


# -- through the engine -----------------------------------------------------------------------


def events_of(req: Request) -> list[TokenEvent]:
    got: list[TokenEvent] = []
    req.listeners.append(lambda e: got.append(e) if isinstance(e, TokenEvent) else None)
    return got


def run(prompt: tuple[int, ...], **params: Any) -> tuple[Request, list[TokenEvent]]:
    eng, _ = engine()
    req = request(max_tokens=params.pop("max_tokens", 6), **params)
    req.prompt_tokens = prompt
    got = events_of(req)
    eng.add(req)
    run_to_idle(eng)
    assert eng.kv.free_blocks == eng.kv.total_blocks
    return req, [e for e in got if e.token_id >= 0]


PROMPT = (10, 11, 12, 13)


def test_engine_logprobs_match_a_numpy_reference_of_the_model_s_rows() -> None:
    req, events = run(PROMPT, logprobs=True, top_logprobs=3)
    reference = model()  # the synthetic rows are a function of (last token, position)
    last, pos = PROMPT[-1], len(PROMPT)
    for e in events:
        ref = log_softmax(reference._logits(last, pos))
        assert e.logprob == pytest.approx(ref[e.token_id], abs=1e-5)
        order = sorted(range(ref.size), key=lambda t: (-ref[t], t))[:3]
        assert [t.token_id for t in e.top_logprobs] == order
        np.testing.assert_allclose([t.logprob for t in e.top_logprobs], ref[order], atol=1e-5)
        last, pos = e.token_id, pos + 1
    plain, plain_events = run(PROMPT)
    assert plain.final and req.final and plain.final.text == req.final.text
    assert all(e.logprob is None and e.top_logprobs == () for e in plain_events)


def test_presence_penalty_and_bias_steer_greedy_decoding() -> None:
    _, greedy = run(PROMPT, max_tokens=3)
    first = greedy[0].token_id
    # The synthetic next token depends on the last token and the position only, so this
    # prompt has the same greedy pick, now inside the penalty window: penalties move off it.
    seen = (first, *PROMPT[1:])
    _, unpenalized = run(seen, max_tokens=1)
    assert unpenalized[0].token_id == first
    for penalty in ({"presence_penalty": 20.0}, {"frequency_penalty": 20.0},
                    {"repetition_penalty": 100.0}):
        _, penalized = run(seen, max_tokens=1, **penalty)
        assert penalized[0].token_id != first, penalty
    _, outside = run(seen, max_tokens=1, presence_penalty=20.0, penalty_last_n=3)
    assert outside[0].token_id == first  # the window of 3 no longer holds it
    _, banned = run(PROMPT, logit_bias=((first, -100.0),), max_tokens=3)
    assert banned[0].token_id != first and first not in {e.token_id for e in banned}
    _, forced = run(PROMPT, logit_bias=((42, 30.0),), max_tokens=3)
    assert [e.token_id for e in forced] == [42, 42, 42]


def test_a_bias_outside_the_vocabulary_fails_that_request_with_a_clear_error() -> None:
    req, _ = run(PROMPT, logit_bias=((10**6, 1.0),))
    assert req.final and req.final.error_code == "invalid_request_error"
    assert "outside the vocabulary" in (req.final.error or "")
