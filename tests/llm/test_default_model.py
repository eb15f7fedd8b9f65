"""What a plain ``sluice serve`` gives the packaged models: SmolLM2-135M-Instruct as the
default and Gemma 3 270M beside it, each with concurrency decided by the TPOT target over
many slots, each slot with the per-sequence context the 8-slot default had, and a memory
estimate that holds the KV cache those slots need."""

from __future__ import annotations

import pytest

from sluice.backends.base import ModelSpec
from sluice.backends.llamacpp.options import LlamaCppOptions, ctx_layout
from sluice.backends.packaged import DEFAULT_MODEL_ID, GEMMA_MODEL_ID
from sluice.config import DEFAULT_TPOT_TARGET_MS, default_config


def _model_specs() -> list[ModelSpec]:
    return [m.spec() for m in default_config().models]


def test_the_default_is_smollm2_and_gemma_is_served_beside_it() -> None:
    config = default_config()
    assert [m.id for m in config.models] == [DEFAULT_MODEL_ID, GEMMA_MODEL_ID]
    assert config.default_model == DEFAULT_MODEL_ID == "smollm2-135m-instruct"
    assert [m.options["path"] for m in config.models] == [
        "packaged:smollm2-135m-instruct", "packaged:gemma-3-270m"]
    # both fit the one worker's budget at once
    assert sum(m.memory_bytes for m in config.models) <= config.workers.budget_bytes


@pytest.mark.parametrize("index", [0, 1], ids=["smollm2", "gemma"])
def test_the_packaged_models_have_a_tpot_target_and_slots_beyond_eight(index: int) -> None:
    spec = _model_specs()[index]
    options = LlamaCppOptions.from_spec(spec)
    assert spec.tpot_target_s == DEFAULT_TPOT_TARGET_MS / 1000 == 0.150
    assert options.n_seq_max == 32
    assert not options.kv_unified
    total, per_seq = ctx_layout(options.n_ctx, options.n_seq_max, options.kv_unified)
    assert per_seq == 1024  # a sequence may still hold 1024 tokens, as with 8 slots of 8192
    assert total == 32 * 1024


@pytest.mark.parametrize("index", [0, 1], ids=["smollm2", "gemma"])
def test_the_memory_estimates_hold_the_kv_cache_of_every_slot(index: int) -> None:
    pytest.importorskip("llama_cpp", reason="the llm extra is not installed")
    from sluice.backends.llamacpp.options import resolve_model_path
    from sluice.backends.llamacpp.sizing import estimate_memory_bytes

    spec = _model_specs()[index]
    options = LlamaCppOptions.from_spec(spec)
    estimate = estimate_memory_bytes(resolve_model_path(spec, options), options.n_ctx)
    assert estimate <= spec.memory_bytes < 1.1 * estimate
