"""Dynamic batching for one-shot models: how many requests at the head of an inbox run now."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BatchDecision:
    """Run the first ``take`` inbox items as one batch now, or wait."""

    take: int
    """Inbox-head items to run now as one batch (0 = wait)."""
    wait_until_s: float | None
    """When ``take == 0``: when to decide again (``None``: nothing to wait for)."""


def decide_batch(
    inbox_model_ids: Sequence[str],
    head_enqueued_s: float,
    now: float,
    *,
    max_batch_size: int,
    max_wait_s: float,
) -> BatchDecision:
    """Batch the contiguous same-model run at the head of the inbox, or wait for it to grow.

    Invariants: a batch is a contiguous same-model prefix of the inbox (A1 B1 A2 A3 runs as
    [A1] [B1] [A2 A3], never [A1 A2 A3]) of at most ``max_batch_size`` items. The run is taken
    now when it is full, when another model's request follows it (waiting cannot grow it), or
    once the head has waited ``max_wait_s``; otherwise the decision is to wait until then.
    An empty inbox gives ``BatchDecision(0, None)``.
    """
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    if not math.isfinite(max_wait_s) or max_wait_s < 0:
        raise ValueError(f"max_wait_s must be a finite number >= 0, got {max_wait_s}")
    if not inbox_model_ids:
        return BatchDecision(0, None)
    head_model = inbox_model_ids[0]
    run = 1
    while (
        run < max_batch_size
        and run < len(inbox_model_ids)
        and inbox_model_ids[run] == head_model
    ):
        run += 1
    deadline_s = head_enqueued_s + max_wait_s
    blocked = run < len(inbox_model_ids)  # full, or another model's request follows
    if run == max_batch_size or blocked or now >= deadline_s:
        return BatchDecision(run, None)
    return BatchDecision(0, deadline_s)
