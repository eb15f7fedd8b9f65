"""The configuration ``sluice serve`` runs with no file: the packaged models and their
latency targets."""

from __future__ import annotations

from typing import Any

from sluice.config.file import Config

DEFAULT_TPOT_TARGET_MS = 150.0
"""The packaged models' time per output token target: the TPOT bound of issue 15's goodput
(a reader's pace is about 5-10 tokens/s; 150 ms keeps a stream ahead of it)."""
DEFAULT_TTFT_TARGET_MS = 2000.0
"""The packaged model's first-token target: while the waiting line would miss it, the
engine runs past the TPOT target's width rather than queue without bound, and refuses
early (with a Retry-After) what would miss it even so."""
DEFAULT_SEQ_SLOTS = 32
"""The packaged models' sequence slots: a ceiling, not the decision (the TPOT budget picks
how many decode at once). Gemma 3 270M decodes 32 at once in 115-138 ms a step on 2 cores
(bench/results/kv_layout.json), so 32 slots leave the target, not the slots, to decide."""
DEFAULT_RETAINED_SLOTS = 4
"""The packaged models' idle slots that keep a prefix (a shared system prompt or two)."""
DEFAULT_KV_CELLS_PER_SEQ = 1024
"""KV cells each slot's own stream holds (prompt + generated tokens of one sequence)."""


def packaged_model(model_id: str, memory_bytes: int) -> dict[str, Any]:
    """The ``[[models]]`` entry of a packaged model as ``sluice serve`` runs it.

    Concurrency follows the latency target, not a slot count: 32 slots of 1024 KV cells
    each (one stream per sequence, the faster layout at these lengths) under a 150 ms TPOT
    target, so it runs as many sequences at once as keep every stream within 150 ms a
    token, up to 32; the step-time model behind that starts from a warm-up of real steps
    measured when the model loads."""
    return {
        "id": model_id, "kind": "generative", "backend": "llamacpp", "task": "generation",
        "memory_bytes": memory_bytes, "load_cost_s": 1.0,
        "tpot_target_ms": DEFAULT_TPOT_TARGET_MS,
        "ttft_target_ms": DEFAULT_TTFT_TARGET_MS,
        # the step-time prior measured on this host at load, not a guess
        "step_cost_warmup": True,
        "options": {"path": f"packaged:{model_id}",
                    "n_ctx": DEFAULT_SEQ_SLOTS * DEFAULT_KV_CELLS_PER_SEQ,
                    "n_seq_max": DEFAULT_SEQ_SLOTS, "n_threads": 2},
    }


def default_config() -> Config:
    """Serve the packaged models on one worker: SmolLM2-135M-Instruct as
    ``smollm2-135m-instruct`` (the default: an instruction-tuned chat model with its ChatML
    template) and Gemma 3 270M as ``gemma-3-270m`` (a base model: completions only), each
    as ``packaged_model`` describes. Gemma loads on its first request."""
    return Config.model_validate(
        {
            "models": [
                # memory (backends/llamacpp/sizing.py, 32768 cells): the file x 1.25 plus
                # per cell 30 layers x 3 KV heads x (64 + 64) x 2 bytes = 878 MB
                packaged_model("smollm2-135m-instruct", 900_000_000),
                # 18 layers x 1 KV head x (256 + 256) x 2 bytes per cell: 920 MB
                packaged_model("gemma-3-270m", 950_000_000),
            ],
            "server": {"default_model": "smollm2-135m-instruct"},
            "workers": {"count": 1, "budget_bytes": 2_000_000_000, "inbox_capacity": 32},
            # few retained prefixes, so that ended sequences' slots return to the free
            # slots (lowest handed out first) and the running ones stay on the lowest
            # streams: spread over 32 streams a batch decodes up to 3x slower
            "engine": {"max_retained_slots": DEFAULT_RETAINED_SLOTS},
            "scheduling": {"queue_capacity": 64},
        }
    )
