"""Picking a token from one (already processed) logits row: temperature, ``min_p``,
``top_k``, ``top_p``.

Gemma's vocabulary has 262,144 entries, so nothing here sorts the whole row: greedy is an
argmax; plain sampling exponentiates in float32 (numpy's float64 ``exp`` is 4x slower) and
inverts the CDF by block sums (a pairwise sum per 1,024 tokens, then one block's running
sum) instead of a sequential running sum over the row; ``min_p`` and ``top_k`` keep a
candidate set; ``top_p`` looks at a partitioned head of 1,024 tokens, grown 8x at a time
while the nucleus reaches past it (a flat row sorts all 262k only when it must). Measured
on a 262,144 row (``bench/micro/sampling_bench.py``): plain sampling 0.9 ms (was 5 ms with a
float64 ``exp`` and ``cumsum``), greedy 0.05 ms.

Filters apply in this order, each on the survivors of the one before: temperature, then
``min_p`` (tokens whose probability is below ``min_p`` times the top token's are
dropped), then ``top_k``, then ``top_p`` (the smallest most-likely set holding ``top_p``
of the remaining mass). Temperature comes first as in vLLM and the OpenAI API; llama.cpp
applies its filters before temperature. Penalties, logit bias and grammar masks change
the row before it gets here (``sluice.engine.logits``).

Every well-typed value is served, whatever its size: any integer seed (reduced to 64 bits,
``new_rng``), temperatures below ``MIN_TEMPERATURE`` (greedy: dividing by them would
overflow), ``top_k`` past the vocabulary (no cut), ``min_p`` of 0 (off) up to 1 (only the
top tokens). A row whose distribution is not finite (a NaN, a +inf, or every entry -inf)
raises ``SamplingError``: the engine ends that request alone with a clear error.
"""

from __future__ import annotations

import math

import numpy as np

from sluice.engine.logprobs import top_logprobs
from sluice.engine.request import SamplingParams, TokenProb

NUCLEUS_HEAD = 1024
"""Candidates partitioned out for top-p before falling back to a full sort."""

MIN_TEMPERATURE = 1e-5
"""Temperatures below this sample greedily (as vLLM's sampling epsilon): the distribution
is already a point mass to float precision, and smaller divisors overflow."""

SEED_MASK = (1 << 64) - 1
"""Seeds are reduced to their low 64 bits (two's complement for negative seeds)."""

CDF_BLOCK = 1024
"""Tokens per block when inverting the CDF of a long row."""


class SamplingError(ValueError):
    """The logits row does not define a distribution (NaN, +inf, or nothing finite)."""


def new_rng(seed: int, stream: int = 0) -> np.random.Generator:
    """The generator for a request's seed: any Python integer (negative, or wider than 64
    bits, as OpenAI and llama.cpp accept) maps to its low 64 bits, so equal seeds give
    equal streams and none is refused. ``stream`` > 0 gives choice ``stream`` of an
    ``n``-choice request its own independent stream (choice 0 is the plain seed's)."""
    low = int(seed) & SEED_MASK
    if stream == 0:
        return np.random.default_rng(low)
    return np.random.default_rng([low, int(stream)])


def sample_token(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """Pick the next token: argmax at temperatures below ``MIN_TEMPERATURE``, else
    temperature / min-p / top-k / top-p sampling. Raises ``SamplingError`` when
    ``logits`` is not a distribution."""
    row = np.asarray(logits, dtype=np.float32)
    temperature = params.temperature
    if not temperature >= MIN_TEMPERATURE:  # also NaN
        index = int(np.argmax(row))  # the first NaN, if any: checked below
        _check_finite(float(row[index]))
        return index
    top = float(row.max())  # NaN if any entry is NaN, +inf if any is +inf
    _check_finite(top)
    cand, scaled = _filtered(row, params, top)
    if params.top_p < 1.0:
        chosen = _nucleus(scaled, params.top_p, rng)
    else:
        chosen = draw_index(np.exp(scaled), rng)
    return chosen if cand is None else int(cand[chosen])


def post_chain_probs(logits: np.ndarray, params: SamplingParams, token: int,
                     k: int) -> tuple[float, tuple[TokenProb, ...]]:
    """The distribution ``sample_token`` draws from for this row, as llama-server's
    ``post_sampling_probs`` reports it: ``token``'s probability in it (0.0 if the chain
    dropped it) and its ``k`` most likely candidates (ties: lower id first), each with a
    positive probability. The kept candidates' probabilities sum to 1, so fewer than
    ``k`` come back only when fewer are kept. Greedy rows are a point mass: the argmax has
    1.0, and it is the one candidate. Raises ``SamplingError`` as ``sample_token``."""
    row = np.asarray(logits, dtype=np.float32)
    if not params.temperature >= MIN_TEMPERATURE:  # also NaN
        index = int(np.argmax(row))
        _check_finite(float(row[index]))
        return (1.0 if token == index else 0.0), ((TokenProb(index, 1.0),) if k > 0 else ())
    top = float(row.max())
    _check_finite(top)
    cand, scaled = _filtered(row, params, top)
    if params.top_p < 1.0:  # the nucleus: the same set _nucleus draws from
        kept = _nucleus_set(scaled, np.exp(scaled), params.top_p)
        cand = kept if cand is None else cand[kept]
        scaled = scaled[kept]
    if cand is not None:  # candidates in id order, so a tie reports the lower id first
        order = np.argsort(cand, kind="stable")
        cand, scaled = cand[order], scaled[order]
    lse = math.log(float(np.exp(scaled).sum(dtype=np.float64)))
    if cand is None:
        at = token if 0 <= token < row.size else -1
    else:
        found = int(np.searchsorted(cand, token))
        at = found if found < cand.size and int(cand[found]) == token else -1
    prob = math.exp(float(scaled[at]) - lse) if at >= 0 else 0.0
    best = top_logprobs(scaled, lse, k) if k > 0 else ()
    ids = [t.token_id if cand is None else int(cand[t.token_id]) for t in best]
    probs = [math.exp(t.logprob) for t in best]
    # a masked (-inf) or vanishing candidate has probability 0: never reported
    return prob, tuple(TokenProb(i, p) for i, p in zip(ids, probs, strict=True) if p > 0.0)


def _filtered(row: np.ndarray, params: SamplingParams,
              top: float) -> tuple[np.ndarray | None, np.ndarray]:
    """The survivors of ``min_p`` and ``top_k`` (indices into ``row``; None = the whole
    row) and their logits after temperature, shifted so the top is 0 (float32)."""
    temperature = params.temperature
    # min_p and top_k select on the raw row (temperature keeps the order, and min_p's
    # bound (l - top) / T >= log(min_p) is l >= top + T log(min_p)); only the survivors
    # are scaled.
    cand: np.ndarray | None = None  # indices of the survivors; None = the whole row
    if params.min_p > 0.0 and not math.isinf(temperature):
        bound = top + temperature * math.log(min(params.min_p, 1.0))
        cand = np.flatnonzero(row >= np.float32(bound))
    n_cand = row.size if cand is None else cand.size
    if 0 < params.top_k < n_cand:
        vals = row if cand is None else row[cand]
        part = np.argpartition(vals, -params.top_k)[-params.top_k :]
        cand = part if cand is None else cand[part]
    kept = row if cand is None else row[cand]
    if math.isinf(temperature):  # the limit: every finite logit equally likely
        scaled = np.where(np.isfinite(kept), np.float32(0.0), np.float32(-np.inf))
    else:
        # Shifted so the top is 0 (exp never overflows), then divided in float32: the
        # quotient may reach -1e5 x the logit range, far inside float32's range.
        scaled = (kept - np.float32(top)) * np.float32(1.0 / temperature)
    return cand, scaled


def _check_finite(value: float) -> None:
    if not math.isfinite(value):
        what = "NaN" if math.isnan(value) else ("+inf" if value > 0 else "only -inf")
        raise SamplingError(f"the model's next-token logits are not a distribution ({what})")


def _nucleus(scaled: np.ndarray, top_p: float, rng: np.random.Generator) -> int:
    """Sample an index of ``scaled`` (which holds its maximum, 0) after keeping the
    smallest most-likely set holding ``top_p`` of its mass."""
    weights = np.exp(scaled)
    idx = _nucleus_set(scaled, weights, top_p)
    return int(idx[draw_index(weights[idx], rng)])


def _nucleus_set(scaled: np.ndarray, weights: np.ndarray, top_p: float) -> np.ndarray:
    """The indices of ``scaled`` (``weights`` = its exponentials) in the smallest
    most-likely set holding ``top_p`` of the mass, most likely first."""
    total = float(weights.sum(dtype=np.float64))
    size = scaled.size
    head = min(NUCLEUS_HEAD, size)
    while True:  # a flatter distribution needs a longer head: grow it 8x at a time
        idx = np.argpartition(scaled, -head)[-head:] if head < size else np.arange(size)
        if head >= size or float(weights[idx].sum(dtype=np.float64)) >= top_p * total:
            break
        head = min(head * 8, size)
    idx = idx[np.argsort(-scaled[idx], kind="stable")]
    probs = weights[idx].astype(np.float64)
    keep = int(np.searchsorted(np.cumsum(probs) / total, top_p) + 1)
    kept: np.ndarray = idx[:keep]
    return kept


def draw_index(weights: np.ndarray, rng: np.random.Generator) -> int:
    """An index drawn with probability proportional to ``weights`` (non-negative, some
    positive). Never returns an index of weight 0, whatever the rounding."""
    n = weights.size
    if n <= 2 * CDF_BLOCK:
        return _invert(weights, rng.random())
    n_full = n // CDF_BLOCK
    sums = weights[: n_full * CDF_BLOCK].reshape(n_full, CDF_BLOCK).sum(axis=1, dtype=np.float64)
    if n_full * CDF_BLOCK < n:
        sums = np.append(sums, weights[n_full * CDF_BLOCK :].sum(dtype=np.float64))
    cdf = np.cumsum(sums)
    u = rng.random() * float(cdf[-1])
    block = _positive_at_or_before(sums, int(np.searchsorted(cdf, u, side="right")))
    before = float(cdf[block - 1]) if block else 0.0
    seg = weights[block * CDF_BLOCK : (block + 1) * CDF_BLOCK]
    fraction = (u - before) / float(sums[block])
    return block * CDF_BLOCK + _invert(seg, min(max(fraction, 0.0), 1.0))


def _invert(weights: np.ndarray, fraction: float) -> int:
    """The index where the running sum of ``weights`` passes ``fraction`` of the total."""
    cdf = np.cumsum(weights, dtype=np.float64)
    index = int(np.searchsorted(cdf, fraction * float(cdf[-1]), side="right"))
    return _positive_at_or_before(weights, index)


def _positive_at_or_before(weights: np.ndarray, index: int) -> int:
    """``index`` if its weight is positive, else the nearest positive one before it (after
    it when none is before): rounding may land a draw on a masked token's edge."""
    index = min(index, weights.size - 1)
    if weights[index] > 0:
        return index
    before = np.flatnonzero(weights[: index + 1] > 0)
    if before.size:
        return int(before[-1])
    return int(np.flatnonzero(weights > 0)[0])
