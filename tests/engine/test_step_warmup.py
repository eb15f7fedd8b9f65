"""The warm-up that measures a generative model's step-time prior at load: it recovers a
linear step cost from the passes it runs, and leaves every slot it used empty."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from sluice.backends.base import ForwardChunk
from sluice.engine.step_warmup import measure_step_cost, warmup_batches
from sluice.policy.step.step_cost import DEFAULT_STEP_COST, StepCost

TRUE = StepCost(base_s=0.020, per_decode_token_s=0.004, per_prefill_token_s=0.0008)


class _LinearModel:
    """A stand-in whose forward passes take ``TRUE``'s seconds on a fake clock."""

    n_seq_max = 32
    vocab_size = 100

    def __init__(self) -> None:
        self.now = 0.0
        self.held: dict[int, int] = {}
        self.passes: list[list[ForwardChunk]] = []

    def clock(self) -> float:
        return self.now

    def forward(self, chunks: Sequence[ForwardChunk]) -> np.ndarray:
        for c in chunks:
            assert c.start_pos == self.held.get(c.seq_slot, 0)
            assert all(0 <= t < self.vocab_size for t in c.tokens)
            self.held[c.seq_slot] = c.start_pos + len(c.tokens)
        decodes = sum(1 for c in chunks if len(c.tokens) == 1)
        prefill = sum(len(c.tokens) for c in chunks if len(c.tokens) > 1)
        self.now += TRUE.predict_s(decodes, prefill)
        self.passes.append(list(chunks))
        return np.zeros((len(chunks), self.vocab_size), dtype=np.float32)

    def release_sequence(self, seq_slot: int) -> None:
        self.held.pop(seq_slot, None)


def test_the_warmup_recovers_a_linear_step_cost_and_frees_its_slots() -> None:
    model = _LinearModel()
    cost = measure_step_cost(model, DEFAULT_STEP_COST, clock=model.clock)  # type: ignore[arg-type]
    assert cost.base_s == pytest.approx(TRUE.base_s, rel=1e-6)
    assert cost.per_decode_token_s == pytest.approx(TRUE.per_decode_token_s, rel=1e-6)
    assert cost.per_prefill_token_s == pytest.approx(TRUE.per_prefill_token_s, rel=1e-6)
    assert model.held == {}
    widths = {len(p) for p in model.passes}
    assert widths >= set(warmup_batches(32)) == {1, 8, 16, 32}


def test_warmup_batches_stay_within_the_slots() -> None:
    assert warmup_batches(1) == (1,)
    assert warmup_batches(2) == (1, 2)
    assert warmup_batches(8) == (1, 2, 4, 8)
