"""What a plain ``sluice serve`` gives the packaged model: concurrency decided by the TPOT
target over many slots, each slot with the per-sequence context the 8-slot default had,
and a memory estimate that holds the KV cache those slots need."""

from __future__ import annotations

import pytest

from sluice.backends.base import ModelSpec
from sluice.backends.llamacpp.options import LlamaCppOptions, ctx_layout
from sluice.config import DEFAULT_TPOT_TARGET_MS, default_config


def _model_spec() -> ModelSpec:
    (model,) = default_config().models
    return model.spec()


def test_the_default_model_has_a_tpot_target_and_slots_beyond_eight() -> None:
    spec = _model_spec()
    options = LlamaCppOptions.from_spec(spec)
    assert spec.tpot_target_s == DEFAULT_TPOT_TARGET_MS / 1000 == 0.150
    assert options.n_seq_max == 32
    assert not options.kv_unified
    total, per_seq = ctx_layout(options.n_ctx, options.n_seq_max, options.kv_unified)
    assert per_seq == 1024  # a sequence may still hold 1024 tokens, as with 8 slots of 8192
    assert total == 32 * 1024


def test_the_default_memory_estimate_holds_the_kv_cache_of_every_slot() -> None:
    pytest.importorskip("llama_cpp", reason="the llm extra is not installed")
    from sluice.backends.llamacpp.options import resolve_model_path
    from sluice.backends.llamacpp.sizing import estimate_memory_bytes

    spec = _model_spec()
    options = LlamaCppOptions.from_spec(spec)
    estimate = estimate_memory_bytes(resolve_model_path(spec, options), options.n_ctx)
    assert estimate <= spec.memory_bytes < 1.1 * estimate
