"""Extreme but well-typed sampling values (issue 11): the combinations that once killed a
worker or that sit at the ends of each field's schema. Each must be served (200) on the
real model. One list for ``tests/llm/test_extreme_llm.py`` (each sent once, then a plain
request to the same worker) and ``bench/chaos.py`` (mixed into the chaos load); the
whole range is covered on the synthetic backend by the property tests in
``tests/reliability/test_sampling_range.py``."""

from __future__ import annotations

from typing import Any

EXTREMES: list[dict[str, Any]] = [
    {"seed": -1},
    {"seed": -(2**70), "temperature": 0.7},
    {"seed": 2**64 + 5, "top_k": 40},
    {"temperature": 1e-320, "top_k": 5},
    {"temperature": 5e-324, "top_p": 0.9},
    {"temperature": 2.0, "top_p": 5e-324, "min_p": 1.0},
    {"top_k": 100_000, "min_p": 5e-324, "temperature": 1e-6},
    {"repetition_penalty": 5e-324, "frequency_penalty": 2.0, "presence_penalty": -2.0},
    {"repetition_penalty": 10.0, "penalty_last_n": -1, "logit_bias": {"1": -100, "2": 100}},
    {"n": 4, "temperature": 1e-320, "seed": -7, "logprobs": True, "top_logprobs": 20},
    {"stop": ["\x00", "a" * 256, "\n", "."], "temperature": 0.0},
]
"""Extra fields of a chat completion request, one combination each."""
