"""The llama.cpp backend with one unified KV pool (``kv_unified``): any sequence may fill
the whole context, prefix copies share cells, and the tokens agree with per-sequence
streams (by the margin rule: llama.cpp does not promise bit-identical logits)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the 'llm' extra)")

from sluice.backends.base import ModelSpec
from sluice.backends.llamacpp import LlamaCppBackend, LlamaCppGenerative, ctx_layout
from tests.backends.test_llamacpp import (
    PROMPTS,
    _assert_margin_rule,
    _greedy_batch,
    _prefill,
    _text,
)

pytestmark = pytest.mark.llm


def _spec(unified: bool) -> ModelSpec:
    return ModelSpec("gemma-3-270m", "generative", "llamacpp", 400 * 2**20, options={
        "path": "packaged:gemma-3-270m",
        "n_ctx": 2048, "n_seq_max": 8, "n_threads": 2, "kv_unified": unified})


@pytest.fixture(scope="module")
def unified() -> Iterator[LlamaCppGenerative]:
    m = LlamaCppBackend().load(_spec(True))
    yield m
    m.close()


def test_one_pool_any_sequence_may_fill(unified: LlamaCppGenerative) -> None:
    assert unified.kv_unified
    assert (unified.n_ctx_total, unified.n_ctx_per_seq) == ctx_layout(2048, 8, True)
    assert unified.n_ctx_per_seq == 2048
    tok = LlamaCppBackend().load_tokenizer(_spec(True))
    try:
        assert tok.n_ctx_per_seq == 2048
    finally:
        tok.close()
    # 600 tokens in one sequence: more than a split stream's 2048 / 8 = 256
    long_prompt = (unified.tokenize(PROMPTS[1], add_bos=True) * 60)[:600]
    logits = _prefill(unified, 5, long_prompt)
    assert logits.shape == (unified.vocab_size,) and np.isfinite(logits).all()
    unified.release_sequence(5)


def test_greedy_tokens_agree_with_split_streams(unified: LlamaCppGenerative) -> None:
    prompts = [unified.tokenize(p, add_bos=True) for p in PROMPTS]
    tokens, rows = _greedy_batch(unified, prompts, 8)
    again, _ = _greedy_batch(unified, prompts, 8)
    assert tokens == again
    split = LlamaCppBackend().load(_spec(False))
    try:
        split_tokens, split_rows = _greedy_batch(split, prompts, 8)
    finally:
        split.close()
    for s in range(len(prompts)):
        for step in range(8):
            if tokens[s][:step] != split_tokens[s][:step]:
                break  # a near tie earlier: the contexts differ from here on
            _assert_margin_rule(split_rows[s][step], rows[s][step], f"seq {s} step {step}")
    assert _text(unified, tokens[0]).startswith(" Paris")


def test_a_prefix_copy_shares_the_pool(unified: LlamaCppGenerative) -> None:
    system = unified.tokenize("You are a helpful assistant who answers short questions about "
                              "the capital cities of Europe. Question:", add_bos=True)
    suffix_a = unified.tokenize(" What is the largest ocean on Earth? Answer:", add_bos=False)
    suffix_b = unified.tokenize(" What is the capital of Italy? Answer:", add_bos=False)
    _prefill(unified, 0, system + suffix_a)
    unified.copy_sequence(0, 1, len(system))
    assert unified.slot_len[1] == len(system)
    copied = _prefill(unified, 1, suffix_b, len(system))
    whole = _prefill(unified, 2, system + suffix_b)
    _assert_margin_rule(whole, copied, "copied prefix")
    for slot in (0, 1, 2):
        unified.release_sequence(slot)
