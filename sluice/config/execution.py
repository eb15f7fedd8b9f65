"""How requests are executed: the ``[workers]`` pool, one-shot ``[batching]``, the
generative ``[engine]``, the queue and policies of ``[scheduling]``, and what a
decoding constraint may cost (``[constraints]``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sluice.config._base import _Strict
from sluice.engine.constraints.limits import ConstraintLimits


class WorkersConfig(_Strict):
    """The worker pool: ``count`` workers with the same limits."""

    count: int = Field(default=1, ge=1, le=64)
    budget_bytes: int = Field(default=2_000_000_000, gt=0)
    inbox_capacity: int = Field(default=8, ge=1)
    eviction: Literal["lru", "cost_aware"] = "lru"
    watchdog_s: float = Field(default=30.0, gt=0)
    """A worker that holds work and shows no progress for this long (one engine step or
    one batch) is declared dead: its requests fail at once and a new worker replaces it.
    Keep it a few times the slowest step (a full prefill chunk of the largest model)."""
    load_watchdog_s: float = Field(default=600.0, gt=0)
    """The same allowance while a worker loads a model, runs a freshly loaded model's
    first step (llama.cpp sets up buffers there: seconds), or runs an admin call."""
    isolation: Literal["thread", "process"] = "thread"
    """``thread``: each worker is a thread of the server's process. ``process``: each
    worker runs in a child process of its own (``sluice.engine.worker.process``), so a
    crash in C code ends that worker's requests (500 ``worker_failed``) and a replacement
    process loads its models while the server and its other workers go on."""


class BatchingConfig(_Strict):
    """Dynamic batching of one-shot models."""

    max_batch_size: int = Field(default=8, ge=1, le=1024)
    max_wait_ms: float = Field(default=5.0, ge=0)


DEFAULT_CACHE_RAM_MIB = 1024
"""Host memory per engine for dropped prefixes: about 45,000 tokens of SmolLM2-135M's KV
(23 KB a token), 150 prompts of 300 tokens."""


class EngineSection(_Strict):
    """Continuous batching of generative models."""

    mode: Literal["continuous", "static", "serial"] = "continuous"
    max_batch_tokens: int = Field(default=512, ge=1)
    prefill_chunk_tokens: int = Field(default=256, ge=1)
    kv_block_tokens: int = Field(default=16, ge=1)
    static_max_wait_ms: float = Field(default=50.0, ge=0)
    prefix_reuse: bool = True
    min_prefix_tokens: int = Field(default=16, ge=1)
    retain_prefixes: bool = True
    """An ended sequence's idle slot keeps its KV as a prefix donor (reclaimed on demand)."""
    max_retained_slots: int | None = Field(default=None, ge=0)
    cache_ram_mib: int = Field(default=DEFAULT_CACHE_RAM_MIB, ge=-1)
    """Host memory (MiB) each generative model's engine may fill with the retained prefixes
    its slots drop, to restore one when a prompt shares more of it than the slots offer
    (llama-server's ``--cache-ram``): 0 keeps none, -1 sets no limit."""
    share_prefix_across_tenants: bool = False
    """Let one tenant's request reuse the KV of another tenant's prompt prefix. Off: prefix
    reuse (running donors and retained slots alike) stays within a tenant, since a faster
    first token would tell a tenant how another tenant's prompt begins. On: more reuse
    when tenants share a system prompt, at that cost."""


class ConstraintsConfig(_Strict):
    """What a request's decoding constraint (``response_format``, a required tool call) may
    cost; past a limit it is refused (400 ``constraint_limit_exceeded`` naming the setting)
    before it is compiled (see ``sluice.engine.constraints.limits``)."""

    max_schema_bytes: int = Field(default=100_000, ge=1)
    """The schema's (or regex's, or grammar's) text, in UTF-8 bytes."""
    max_schema_depth: int = Field(default=64, ge=1)
    """Nesting of the JSON schema's objects and arrays."""
    max_schema_alternatives: int = Field(default=1_000, ge=1)
    """``anyOf``/``oneOf``/``allOf`` branches plus ``enum`` values, over the whole schema."""
    max_compile_ms: float = Field(default=2_000.0, gt=0)
    """Compiling one grammar (not counting the model's grammar vocabulary, built once)."""

    def limits(self) -> ConstraintLimits:
        return ConstraintLimits(self.max_schema_bytes, self.max_schema_depth,
                                self.max_schema_alternatives, self.max_compile_ms)


class SchedulingConfig(_Strict):
    """Queue and policies."""

    scheduler: Literal["fifo", "workload_aware", "priority_edf", "wfq"] = "fifo"
    bypass_threshold: int = Field(default=8, ge=0)
    router: Literal["round_robin", "least_loaded", "residency_aware"] = "residency_aware"
    queue_capacity: int = Field(default=64, ge=1)
