"""Log-probabilities as clients see them: the model's own log-softmax of the raw logits.

What is reported is ``log softmax(logits)`` of the row the backend returned, before
temperature, penalties, logit bias, ``min_p`` / ``top_k`` / ``top_p`` and grammar masks:
the model's belief, as OpenAI reports it (and vLLM by default), not the distribution the
token was drawn from. A token a constraint forced, or that sampling drew from far down the
tail, is reported with its true (possibly very low) log-probability.

``row_logsumexp`` works on a whole batch of rows at once (float32 exponentials, float64
sums); the rest is per row.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sluice.engine.request import TokenLogprob

MAX_TOP_LOGPROBS = 20
"""The most alternatives reported per token (OpenAI's bound)."""


def row_logsumexp(rows: np.ndarray) -> np.ndarray:
    """``log(sum(exp(row)))`` of each row of a 2-D array (float64, shape ``(n,)``); a row
    with a NaN or +inf gives NaN or +inf (the sampler reports that row's error)."""
    if rows.shape[0] == 0:
        return np.zeros(0, dtype=np.float64)
    top = rows.max(axis=1)
    safe_top = np.where(np.isfinite(top), top, 0.0).astype(np.float32)
    sums = np.exp(rows - safe_top[:, None]).sum(axis=1, dtype=np.float64)
    with np.errstate(divide="ignore"):
        lse: np.ndarray = np.log(sums) + safe_top.astype(np.float64)
    return lse


def top_logprobs(row: np.ndarray, lse: float, k: int) -> tuple[TokenLogprob, ...]:
    """The ``k`` most likely tokens of ``row``, most likely first (ties: lower id first)."""
    k = min(k, MAX_TOP_LOGPROBS, row.size)
    if k <= 0:
        return ()
    part = np.argpartition(row, -k)[-k:] if k < row.size else np.arange(row.size)
    kth = row[part].min()
    above = part[row[part] > kth]
    # argpartition breaks a tie at the k-th value arbitrarily: take the lowest ids
    tied = np.flatnonzero(row == kth)[: k - above.size]
    chosen = np.concatenate([above, tied])
    order = np.lexsort((chosen, -row[chosen]))
    return tuple(TokenLogprob(int(t), float(row[t]) - lse) for t in chosen[order])


def prompt_token_logprobs(rows: np.ndarray, next_tokens: Sequence[int]) -> list[float]:
    """Row ``i`` holds the logits after prompt position ``p + i``; ``next_tokens[i]`` is
    the prompt token at ``p + i + 1``: its log-probability, for each ``i``."""
    if not len(next_tokens):
        return []
    rows = rows[: len(next_tokens)]
    lse = row_logsumexp(rows)
    picked = rows[np.arange(len(next_tokens)), np.asarray(next_tokens, dtype=np.int64)]
    return [float(x) for x in picked.astype(np.float64) - lse]
