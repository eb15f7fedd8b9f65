"""One source of configuration: a TOML file parsed into validated pydantic models, with
CLI flags and ``SLUICE_*`` environment variables applied over it (flags win).

With no file, ``default_config()`` serves the packaged SmolLM2-135M-Instruct as
``smollm2-135m-instruct`` (the default) and Gemma 3 270M as ``gemma-3-270m``.
Validation errors name the bad field and value.
"""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from sluice.backends.base import ModelSpec, ReasoningFormat
from sluice.backends.faults import FaultPlan
from sluice.engine.constraints.limits import ConstraintLimits
from sluice.engine.continuous import EngineConfig
from sluice.engine.runtime import RuntimeConfig
from sluice.engine.variants import GroupSpec
from sluice.engine.worker import WorkerConfig
from sluice.policy.keep_alive import PINNED, STAY, parse_keep_alive
from sluice.policy.planner import PlannerConfig
from sluice.policy.quota import QuotaLimits


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FaultsConfig(_Strict):
    """Injected faults (tests and the chaos bench; never in production): calls of the
    model's ``forward`` / ``run_batch``, numbered from 1 across its loads, that kill the
    worker's thread or hang it (see ``sluice.backends.faults``)."""

    kill_on_calls: list[int] = Field(default_factory=list)
    hang_on_calls: list[int] = Field(default_factory=list)
    kill_probability: float = Field(default=0.0, ge=0, le=1)
    hang_probability: float = Field(default=0.0, ge=0, le=1)
    hang_s: float = Field(default=3600.0, ge=0)
    seed: int = 0
    kill_mode: Literal["raise", "abort", "segv", "sigkill"] = "raise"
    """``raise``: a kill ends the worker's thread; ``abort``, ``segv``, ``sigkill``: it ends
    the worker's process (``workers.isolation = "process"`` only)."""

    def plan(self) -> FaultPlan:
        return FaultPlan(frozenset(self.kill_on_calls), frozenset(self.hang_on_calls),
                         self.kill_probability, self.hang_probability, self.hang_s, self.seed,
                         self.kill_mode)


class ReasoningConfig(_Strict):
    """A generative model that thinks in tags before it answers."""

    start: str = Field(default="<think>", min_length=1, max_length=64)
    """The tag that opens the thinking."""
    end: str = Field(default="</think>", min_length=1, max_length=64)
    """The tag that closes it; the answer follows."""
    opened: bool = False
    """The chat template opens the thinking itself (the output starts inside it)."""
    enabled: bool = True
    """Thinking on unless a request turns it off (``reasoning_effort: "none"``,
    ``chat_template_kwargs.enable_thinking: false``, Anthropic's ``thinking.type:
    disabled``)."""
    budget_tokens: int | None = Field(default=None, ge=0)
    """Thinking tokens a request gets unless it asks (unset: no limit but its
    ``max_tokens``); past them the end tag is written for the model."""

    def format(self) -> ReasoningFormat:
        return ReasoningFormat(self.start, self.end, self.opened, self.enabled,
                               self.budget_tokens)


class SamplingConfig(_Strict):
    """A model's sampling defaults, for the fields a request leaves out and the model file
    (a GGUF's ``general.sampling.*``) does not set; any left out here are llama-server's
    (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, no penalties over 64 tokens).
    Field names and ranges as in a request."""

    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_k: int | None = Field(default=None, ge=0, le=100_000)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(
        default=None, gt=0.0, le=10.0,
        validation_alias=AliasChoices("repetition_penalty", "repeat_penalty"))
    """llama.cpp's repeat penalty; 1 is off."""
    penalty_last_n: int | None = Field(
        default=None, ge=-1, le=1_000_000,
        validation_alias=AliasChoices("penalty_last_n", "repeat_last_n"))
    """Recent tokens the penalties look at; -1 = the whole context."""
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    seed: int | None = Field(default=None, ge=0, lt=2**64)
    """The seed of a request that sends none (llama-server's ``--seed``); unset: each
    request its own (its id)."""
    over_model_file: bool = False
    """These values win over the model file's recommendation (as llama-server's flags do:
    ``sluice serve --temp`` sets it); off: the file's win."""

    def given(self) -> dict[str, float | int]:
        """The sampling fields this table sets."""
        return {k: v for k, v in self.model_dump(exclude={"over_model_file"}).items()
                if v is not None}


EMBEDDING_SUFFIX = ":embedding"
"""A generative model ``m`` with ``[models.embeddings]`` embeds through ``m:embedding``."""


class EmbeddingsConfig(_Strict):
    """Embeddings from a generative GGUF (llama-server's ``--embedding``): a second llama.cpp
    context over the same file with embeddings on, pooled per input and L2-normalised; a
    one-shot model of its own in residency (loaded on first use, evicted like any other)."""

    pooling: Literal["mean", "cls", "last"] | None = None
    """How the token states of an input become one vector (llama-server's ``--pooling``);
    unset: the file's own (``<arch>.pooling_type``), else ``mean``."""
    n_ctx: int = Field(default=2048, ge=16, le=1_048_576)
    """Tokens of one input at most (longer inputs are cut to it, as Ollama's ``truncate``
    does and the ONNX lane's ``max_tokens``); also the tokens of one forward pass."""
    memory_bytes: int | None = Field(default=None, gt=0)
    """Its resident size; unset: worked out from the file by ``sluice serve FILE.gguf``,
    else the generative model's ``memory_bytes`` (the same weights, an upper bound)."""

    def spec(self, model_id: str, of: ModelSpec) -> ModelSpec:
        """The one-shot spec that embeds for the generative model ``of``."""
        keys = ("path", "n_threads", "n_gpu_layers", "verbose", "extra_bufts")
        options: dict[str, Any] = {k: of.options[k] for k in keys if k in of.options}
        options.update(n_ctx=self.n_ctx, n_batch=self.n_ctx, kv_unified=True)
        if self.pooling is not None:
            options["pooling"] = self.pooling
        return ModelSpec(
            model_id=model_id, kind="oneshot", backend="llamacpp", task="embedding",
            memory_bytes=self.memory_bytes or of.memory_bytes, load_cost_s=of.load_cost_s,
            options=options, keep_alive_s=of.keep_alive_s, pinned=of.pinned)


class ModelConfig(_Strict):
    """One servable model."""

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
    kind: Literal["oneshot", "generative"]
    backend: Literal["synthetic", "llamacpp", "onnx"]
    memory_bytes: int = Field(gt=0)
    load_cost_s: float = Field(default=1.0, ge=0)
    task: Literal["embedding", "classification", "rerank", "generation"] = "embedding"
    """One-shot: ``embedding``, ``classification`` or ``rerank`` (``/v1/rerank``: an onnx
    encoder scoring each document by its cosine similarity to the query, or the synthetic
    backend's word overlap); generative: ``generation``."""
    options: dict[str, Any] = Field(default_factory=dict)
    faults: FaultsConfig | None = None
    """Fault injection (tests and the chaos bench only)."""
    tpot_target_ms: float | None = Field(default=None, gt=0)
    """Generative: time per output token each running sequence stays within; sets how
    many sequences decode at once and how long prefill chunks are (unset: no limit)."""
    ttft_deadline_ms: float | None = Field(default=None, gt=0)
    """Generative: first-token deadline of requests that bring none and whose tenant sets
    none; one predicted to miss it is refused at once (503 ``deadline_infeasible``)."""
    ttft_target_ms: float | None = Field(default=None, gt=0)
    """Generative: first-token target of requests that bring none and whose tenant sets
    none. Soft: while the waiting line would miss it, the engine runs more sequences at
    once than the TPOT target allows (up to the most that keep requests within both
    targets); one predicted to miss it even so is refused at once (503
    ``deadline_infeasible`` with a Retry-After); an admitted one is never ended late."""
    step_cost_file: str | None = None
    """Generative: a profiled step-time model (JSON from ``bench/micro/kv_layout.py``), the prior
    that the engine refines online."""
    step_cost_warmup: bool = False
    """Generative, without ``step_cost_file``: measure that prior when the model loads, from
    a short warm-up of real steps on this host (about 1 s for the packaged model on 2
    cores), so that first-token predictions and the TPOT budget hold from the first
    request; off: a rough default prior, learned past within seconds."""
    keep_alive: float | str | None = None
    """How long the model stays loaded once idle (nothing running or queued for it), in
    Ollama's forms: seconds (``300``), a duration (``"5m"``, ``"1h"``), ``0`` (unload after
    each request), negative (``-1``: pinned). Unset: until evicted to make room. A request's
    own ``keep_alive`` (Ollama's field) overrides it, except a pin."""
    pinned: bool = False
    """Never unloaded by time nor evicted for another model."""
    reasoning: ReasoningConfig | None = None
    """Generative: the model thinks in tags (``<think>`` … ``</think>`` by default); each API
    returns the thinking apart from the answer."""

    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    """Generative: sampling defaults where the model file has none (``[models.sampling]``)."""
    default_max_tokens: int | None = Field(default=None, ge=-1)
    """Generative: the token limit of a request that names none (llama-server's
    ``--n-predict``), within the room its context leaves; ``-1``: until the context is
    full; unset: ``server.default_max_tokens``."""
    embeddings: EmbeddingsConfig | None = None
    """Generative llamacpp: also embed (llama-server's ``--embedding``), through a
    one-shot model ``<id>:embedding`` that ``/v1/embeddings`` and Ollama's embed routes
    use when a request names this model (``[models.embeddings]``)."""
    speculation: Literal["auto", "off"] = "auto"
    """Generative: ``auto`` drafts tokens for greedy requests from their own prompt and
    output (n-gram lookup) and verifies them in the decode step, each step as many as the
    step-time model says pay at that load (none once the batch is compute-bound); the
    output is the same as without. ``off``: never. A request's ``speculation: false``
    turns it off for that request."""
    draft_max: int = Field(default=16, ge=1, le=64)
    """Generative: the most tokens one sequence drafts in a step (llama-server's
    ``--draft-max``)."""
    tags: list[str] = Field(default_factory=list, max_length=64)
    """Labels the model list shows with the model (``/v1/models``' ``tags``, llama-server's
    ``--tags``); nothing else reads them."""

    @field_validator("default_max_tokens")
    @classmethod
    def _max_tokens_form(cls, value: int | None) -> int | None:
        if value == 0:
            raise ValueError("default_max_tokens must be -1 (until the context is full) or "
                             "at least 1, got 0")
        return value

    @field_validator("keep_alive")
    @classmethod
    def _keep_alive_form(cls, value: float | str | None) -> float | str | None:
        if value is not None:
            parse_keep_alive(value)
        return value

    @model_validator(mode="after")
    def _backend_options(self) -> ModelConfig:
        """llamacpp options are checked here, like every other field (an unknown key or a
        bad value names it), rather than when the model first loads."""
        if self.backend == "llamacpp":
            from sluice.backends.base import ModelLoadError
            from sluice.backends.llamacpp.options import LlamaCppOptions

            try:
                LlamaCppOptions.from_spec(self.spec())
            except ModelLoadError as exc:
                raise ValueError(f"options: {exc}") from None
        if self.task == "rerank" and (self.kind != "oneshot"
                                      or self.backend not in ("onnx", "synthetic")):
            raise ValueError(f"task: rerank is served by a one-shot onnx (or synthetic) model, "
                             f"not a {self.kind} {self.backend} one")
        if self.embeddings is not None and (self.backend != "llamacpp"
                                            or self.kind != "generative"):
            raise ValueError(f"embeddings: only a generative llamacpp model embeds this way "
                             f"(got {self.kind} {self.backend}); configure an embedding "
                             f"model of its own instead")
        return self

    @property
    def embedding_id(self) -> str | None:
        """The id of the one-shot model that embeds for this one (``None``: it does not)."""
        return None if self.embeddings is None else f"{self.id}{EMBEDDING_SUFFIX}"

    def specs(self) -> list[ModelSpec]:
        """This model's spec, and its embedding model's after it when it embeds."""
        spec = self.spec()
        if self.embeddings is None or self.embedding_id is None:
            return [spec]
        return [spec, self.embeddings.spec(self.embedding_id, spec)]

    def spec(self) -> ModelSpec:
        keep_alive = PINNED if self.pinned else (
            STAY if self.keep_alive is None else parse_keep_alive(self.keep_alive))
        return ModelSpec(
            model_id=self.id,
            kind=self.kind,
            backend=self.backend,
            memory_bytes=self.memory_bytes,
            load_cost_s=self.load_cost_s,
            task=self.task,
            options=dict(self.options),
            tpot_target_s=None if self.tpot_target_ms is None else self.tpot_target_ms / 1000,
            ttft_deadline_s=None if self.ttft_deadline_ms is None
            else self.ttft_deadline_ms / 1000,
            ttft_target_s=None if self.ttft_target_ms is None else self.ttft_target_ms / 1000,
            step_cost_path=self.step_cost_file,
            step_cost_warmup=self.step_cost_warmup,
            keep_alive_s=keep_alive.idle_s,
            pinned=keep_alive.pinned,
            reasoning=None if self.reasoning is None else self.reasoning.format(),
            sampling=self.sampling.given(),
            sampling_over_model=self.sampling.over_model_file,
            default_max_tokens=self.default_max_tokens,
            embedding_model=self.embedding_id,
            speculation=self.speculation,
            draft_max_tokens=self.draft_max,
        )


class GroupConfig(_Strict):
    """A model group: one-shot variants of one task, most accurate preferred; a request
    naming the group is served by the variant the planner picks (see docs/planner.md)."""

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
    variants: list[str] = Field(min_length=1)
    """Model ids; each variant's accuracy is its ``options.accuracy``."""
    policy: Literal["adaptive", "accurate", "fastest"] = "adaptive"
    """``adaptive`` plans per request; ``accurate`` / ``fastest`` are the baselines."""
    default_deadline_ms: float | None = Field(default=None, gt=0)
    """Deadline for requests of the group that bring none (after the tenant's default)."""
    pessimism: float = Field(default=1.0, gt=0, le=100)
    """Multiplies predicted waits and service times (>= 1 is safer)."""
    low_load_utilization: float = Field(default=0.5, ge=0, le=1)
    """Below this utilization the most accurate variant is taken without prediction."""
    low_load_confidence_z: float = Field(default=2.0, ge=0, le=10)
    """Standard errors by which the measured arrival rate must exceed the low-load line."""


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


class TenantLimits(_Strict):
    """A tenant's quotas; a limit left out is not enforced (see ``sluice.server.quota``)."""

    requests_per_s: float | None = Field(default=None, gt=0)
    """Sustained requests per second; one HTTP request counts once."""
    burst: float | None = Field(default=None, ge=1)
    """Requests admitted at once from a full bucket (default: max(1, requests_per_s))."""
    tokens_per_min: float | None = Field(default=None, gt=0)
    """Prompt + generated tokens per minute; the bucket holds one minute's worth, so it is
    also the largest single request."""
    max_concurrent: int | None = Field(default=None, ge=1)
    """Requests of the tenant admitted and not yet finished."""

    @model_validator(mode="after")
    def _burst_needs_rate(self) -> TenantLimits:
        if self.burst is not None and self.requests_per_s is None:
            raise ValueError(f"limits.burst ({self.burst}) needs limits.requests_per_s")
        return self

    def quota_limits(self) -> QuotaLimits:
        """The limits as the quota policy takes them (per second)."""
        rate = self.requests_per_s
        return QuotaLimits(
            requests_per_s=rate,
            request_burst=self.burst if self.burst is not None else max(1.0, rate or 1.0),
            tokens_per_s=None if self.tokens_per_min is None else self.tokens_per_min / 60.0,
            token_capacity=self.tokens_per_min or 1.0,
            max_concurrent=self.max_concurrent,
        )


class TenantConfig(_Strict):
    """A tenant: its API keys (plain in the file, hashed in memory), weight, priority,
    default deadline and quotas."""

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    api_keys: list[str] = Field(default_factory=list)
    api_keys_file: str | None = None
    """A file with more keys, one per line (blank lines and ``#`` comments skipped): a
    mounted Kubernetes Secret or Docker secret keeps them out of this file. Read when the
    server starts."""
    weight: float = Field(default=1.0, gt=0)
    """Share of served tokens under the ``wfq`` scheduler, relative to other tenants."""
    priority: int = Field(default=5, ge=0, le=9)
    """Default priority class (0 most urgent) when a request names none."""
    priority_ceiling: int | None = Field(default=None, ge=0, le=9)
    """The most urgent class the tenant's requests may ask for (body ``priority`` or the
    ``x-sluice-priority`` header); a request asking for more is served at the ceiling. Unset:
    ``priority`` (a request may only lower its priority). Unconfigured tenants of an open
    server get the ``default`` tenant's."""

    @model_validator(mode="after")
    def _ceiling_above_default(self) -> TenantConfig:
        if self.priority_ceiling is not None and self.priority_ceiling > self.priority:
            raise ValueError(f"tenants[{self.id!r}].priority_ceiling ({self.priority_ceiling}) "
                             f"must be <= priority ({self.priority}): 0 is most urgent")
        return self

    @property
    def most_urgent_priority(self) -> int:
        """The ceiling: the smallest priority class a request of this tenant gets."""
        return self.priority if self.priority_ceiling is None else self.priority_ceiling
    default_deadline_ms: float | None = Field(default=None, gt=0)
    default_ttft_deadline_ms: float | None = Field(default=None, gt=0)
    """First-token deadline of the tenant's generative requests that bring none (before
    the model's ``ttft_deadline_ms``)."""
    default_ttft_target_ms: float | None = Field(default=None, gt=0)
    """First-token target (soft) of the tenant's generative requests that bring none
    (before the model's ``ttft_target_ms``)."""
    limits: TenantLimits = Field(default_factory=TenantLimits)

    def all_api_keys(self) -> list[str]:
        """``api_keys`` and those in ``api_keys_file`` (``ValueError`` naming the field if
        the file cannot be read or holds no key: an empty mounted secret would otherwise
        leave the tenant open to anyone who claims it)."""
        keys = list(self.api_keys)
        if self.api_keys_file is not None:
            try:
                text = Path(self.api_keys_file).read_text()
            except OSError as exc:
                raise ValueError(f"tenants[{self.id!r}].api_keys_file: cannot read "
                                 f"{self.api_keys_file}: {exc.strerror}") from None
            from_file = [k for k in (line.strip() for line in text.splitlines())
                         if k and not k.startswith("#")]
            if not from_file:
                raise ValueError(f"tenants[{self.id!r}].api_keys_file: {self.api_keys_file} "
                                 "holds no key")
            keys += from_file
        return keys


class QuotaConfig(_Strict):
    """Where tenant quotas live: this process (``memory``) or a Redis shared by replicas."""

    backend: Literal["memory", "redis"] = "memory"
    redis_url: str | None = None
    """e.g. ``redis://127.0.0.1:6379/0``; also ``$SLUICE_REDIS_URL`` (which selects redis)."""
    replicas: int = Field(default=1, ge=1, le=10_000)
    """Replicas sharing the quotas: while Redis is unreachable each enforces 1/replicas."""
    key_prefix: str = Field(default="sluice", pattern=r"^[A-Za-z0-9._:-]{1,64}$")
    timeout_ms: float = Field(default=250.0, gt=0, le=60_000)
    """Longest wait for one Redis call before falling back to local buckets."""
    reconnect_interval_s: float = Field(default=1.0, gt=0, le=3600)
    """How often a replica in fallback probes Redis."""
    lease_s: float = Field(default=600.0, gt=0)
    """How long a concurrency slot outlives a replica that died holding it."""

    @model_validator(mode="after")
    def _redis_needs_url(self) -> QuotaConfig:
        if self.backend == "redis" and not self.redis_url:
            raise ValueError("quota.redis_url is required when quota.backend = 'redis'")
        return self


class ServerConfig(_Strict):
    """The HTTP front end."""

    host: str = "127.0.0.1"
    """The address to bind, or several separated by commas (``127.0.0.1,::1``), each on
    ``port``."""
    port: int = Field(default=8000, ge=0, le=65535)
    grpc_port: int | None = Field(default=None, ge=0, le=65535)
    """Serve the gRPC API (``sluice.v1.Inference``, health, reflection) on this port of
    ``host``, from the same process and event loop as HTTP; 0 picks a free port; unset: no
    gRPC. Needs the ``grpc`` extra."""
    admin_key: str | None = None
    """Guards ``/admin`` (``X-Admin-Key`` or ``Authorization: Bearer``); also
    ``$SLUICE_ADMIN_KEY``. Without one (here or in ``admin_key_file``) the admin routes are
    disabled (403) unless ``open_admin`` is set."""
    admin_key_file: str | None = None
    """A file holding the admin key (first non-blank, non-``#`` line): a mounted secret
    keeps it out of this file and off the command line. Also ``--admin-key-file`` and
    ``$SLUICE_ADMIN_KEY_FILE``. Read when the server starts."""
    open_admin: bool = False
    """Open ``/admin`` to anyone when no admin key is set: local development only."""
    metrics_key: str | None = None
    """Guards ``/metrics`` and ``/status.json`` (``Authorization: Bearer`` or
    ``X-Metrics-Key``); also ``$SLUICE_METRICS_KEY``. Unset: they are open on a server
    without tenant keys, and closed (403 ``metrics_disabled``) on one with them, unless
    ``open_metrics`` is set."""
    open_metrics: bool = False
    """Open ``/metrics`` and ``/status.json`` without a metrics key on a server with tenant
    keys (a scraper on a private network); they show every tenant's traffic."""
    require_keys: bool = False
    """Every request needs a tenant's API key: the server refuses to start without one,
    rather than let any client claim a tenant (its priority, its quota) by
    ``X-Tenant-ID``."""
    max_body_bytes: int = Field(default=1_000_000, ge=1024)
    """The largest request body (HTTP: 413 past it) and gRPC request message
    (RESOURCE_EXHAUSTED)."""
    header_timeout_s: float = Field(default=10.0, gt=0)
    """A connection sends a complete request head within this many seconds of connecting
    or of its previous response, or it is closed."""
    body_timeout_s: float = Field(default=30.0, gt=0)
    """A request body arrives whole within this many seconds of its head (408 past it)."""
    keep_alive_timeout_s: float = Field(default=5.0, gt=0)
    """An idle keep-alive connection is closed after this many seconds."""
    max_connections: int | None = Field(default=512, ge=1)
    """HTTP connections and requests in progress at once (uvicorn's ``limit_concurrency``):
    past it a request is answered 503 at once. None: no cap."""
    grpc_max_concurrent_rpcs: int = Field(default=256, ge=1)
    """gRPC calls in progress at once; past it a call is RESOURCE_EXHAUSTED at once."""
    default_model: str | None = None
    """The model of a request that names none (llama-server's ``model`` is optional); unset:
    the first model."""
    unknown_model: Literal["refuse", "default"] = "refuse"
    """A request naming a model that is not served: ``refuse`` (404 ``model_not_found``),
    or on a server with one model ``default``: serve it with that model, as llama-server
    does."""
    model_aliases: dict[str, str] = Field(default_factory=dict)
    """More names for configured models (``--alias a,b`` gives a model both names)."""
    cors_origins: list[str] = Field(default_factory=list)
    """Origins a browser may call from (CORS, llama-server's ``--cors-origins``; ``*``: any;
    ``localhost``: any origin on the loopback, ``http://localhost:3000``, ``http://[::1]``
    ...). Empty (the default): no CORS headers, so browsers refuse cross-origin calls."""
    default_max_tokens: int = Field(default=256, ge=1)
    rerank_max_documents: int = Field(default=1000, ge=1, le=100_000)
    """The most documents one rerank request may hold (400 past it); each is a request of
    its own to the reranker, batched with the others."""
    verbose_answers: bool = False
    """Every chat completion answer (not a stream) carries llama-server's ``__verbose``
    (the prompt as rendered) unless the request sets ``verbose: false`` (llama-server's
    ``--verbose``)."""
    web_ui: bool = True
    """Serve the chat page at ``/`` (off: 404 there, as llama-server's ``--no-ui``)."""
    slots_endpoint: bool = True
    """Serve llama-server's ``GET /slots`` and ``POST /slots/{id}`` (off: 501, as
    llama-server's ``--no-slots``)."""
    drain_timeout_s: float = Field(default=10.0, ge=0)
    log_content: bool = False
    """Log prompt and completion text (debug only; off by default)."""
    trace_file: str | None = None
    """Record every request's arrival (model, tenant, token counts, deadline, priority;
    no text) to this JSONL file, which ``sluice simulate --trace`` replays. Off by
    default."""
    strict_fields: bool = False
    """Refuse request bodies with unknown fields (400 naming the field) instead of ignoring
    them (named in the ``x-sluice-ignored-fields`` header)."""
    openapi: bool = False
    """Serve the OpenAPI schema and its pages (``/openapi.json``, ``/docs``, ``/redoc``).
    Off by default: they list every route, admin ones included, to anyone."""

    slot_save_path: str | None = None
    """The folder ``POST /slots/{id}?action=save|restore`` writes and reads a slot's KV in
    (llama-server's ``--slot-save-path``); unset: slot actions answer 501. Checked to be a
    folder when the server starts."""

    def slot_folder(self) -> Path | None:
        """``slot_save_path`` as a folder (``ValueError`` naming the field when it is not
        one)."""
        if self.slot_save_path is None:
            return None
        folder = Path(self.slot_save_path).expanduser()
        if not folder.is_dir():
            raise ValueError(f"server.slot_save_path: {self.slot_save_path} is not a folder")
        return folder

    @field_validator("host")
    @classmethod
    def _host_list(cls, value: str) -> str:
        if any(not part.strip() for part in value.split(",")):
            raise ValueError(f"server.host: an empty address in {value!r}")
        return value

    @property
    def hosts(self) -> list[str]:
        """Every address ``host`` names, in order."""
        return [part.strip() for part in self.host.split(",")]

    def admin_key_value(self) -> str | None:
        """``admin_key``, else the key in ``admin_key_file`` (``ValueError`` naming the field
        when the file cannot be read or holds no key)."""
        if self.admin_key:
            return self.admin_key
        if self.admin_key_file is None:
            return None
        try:
            text = Path(self.admin_key_file).read_text()
        except OSError as exc:
            raise ValueError(f"server.admin_key_file: cannot read {self.admin_key_file}: "
                             f"{exc.strerror}") from None
        keys = [k for k in (line.strip() for line in text.splitlines())
                if k and not k.startswith("#")]
        if not keys:
            raise ValueError(f"server.admin_key_file: {self.admin_key_file} holds no key")
        return keys[0]


class ClusterConfig(_Strict):
    """Replicas on Ray Serve (``sluice serve --ray``); a plain ``sluice serve`` ignores it, so
    one file serves a single process, Kubernetes replicas and a Ray Serve deployment."""

    address: str | None = None
    """Ray cluster to join (``auto``, ``ray://host:10001``); unset: start a local Ray."""
    min_replicas: int = Field(default=1, ge=1, le=1024)
    max_replicas: int = Field(default=1, ge=1, le=1024)
    initial_replicas: int | None = Field(default=None, ge=1, le=1024)
    num_cpus: float = Field(default=1.0, ge=0)
    """CPUs Ray reserves for each replica (match the workers' threads)."""
    num_gpus: float = Field(default=0.0, ge=0)
    memory_bytes: int | None = Field(default=None, gt=0)
    """Memory Ray reserves for each replica (scheduling only)."""
    resources: dict[str, float] = Field(default_factory=dict)
    """Custom Ray resources each replica needs (e.g. a node label)."""
    router: Literal["affinity", "least_loaded", "round_robin"] = "affinity"
    """Across replicas: residency, then prompt prefix, then load (``affinity``), or a
    baseline."""
    prefix_chars: int = Field(default=256, ge=1, le=1_000_000)
    """Prompts of at least this many characters are hashed on their first this-many, so
    requests sharing a system prompt meet on one replica."""
    load_factor: float = Field(default=1.25, ge=1.0, le=100.0)
    """A prefix's home is passed over once its load would exceed this × the mean."""
    max_ongoing_requests: int | None = Field(default=None, ge=1)
    """Requests one replica holds at once; unset: its queue capacity plus its workers'
    inboxes, so the front end stops sending before the replica would refuse."""
    max_queued_requests: int = Field(default=64, ge=1)
    """Requests a front end holds while every replica is full; past it: 503 at once."""
    target_load_per_replica: float = Field(default=4.0, gt=0)
    """Autoscaling: requests admitted and unfinished per replica to size the fleet for."""
    target_kv_use: float = Field(default=0.8, gt=0, le=1)
    """Autoscaling: KV-block use per replica to size the fleet for."""
    upscale_delay_s: float = Field(default=5.0, ge=0)
    downscale_delay_s: float = Field(default=60.0, ge=0)
    look_back_period_s: float = Field(default=15.0, gt=0)
    """Window over which replica reports are averaged for autoscaling."""
    stats_period_s: float = Field(default=1.0, gt=0)
    """How often each replica reports residency and load to the routers."""
    ingress_replicas: int = Field(default=1, ge=1, le=1024)
    """Front-end replicas (they parse, fingerprint and route; no model)."""
    ingress_num_cpus: float = Field(default=0.25, ge=0)
    health_check_period_s: float = Field(default=5.0, gt=0)
    app_name: str = Field(default="sluice", pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")

    @model_validator(mode="after")
    def _replica_bounds(self) -> ClusterConfig:
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"cluster.max_replicas ({self.max_replicas}) must be >= "
                             f"cluster.min_replicas ({self.min_replicas})")
        initial = self.initial_replicas
        if initial is not None and not self.min_replicas <= initial <= self.max_replicas:
            raise ValueError(f"cluster.initial_replicas ({initial}) must lie in "
                             f"[{self.min_replicas}, {self.max_replicas}]")
        return self


class Config(_Strict):
    """The whole configuration file."""

    server: ServerConfig = Field(default_factory=ServerConfig)
    scheduling: SchedulingConfig = Field(default_factory=SchedulingConfig)
    workers: WorkersConfig = Field(default_factory=WorkersConfig)
    batching: BatchingConfig = Field(default_factory=BatchingConfig)
    engine: EngineSection = Field(default_factory=EngineSection)
    constraints: ConstraintsConfig = Field(default_factory=ConstraintsConfig)
    models: list[ModelConfig] = Field(min_length=1)
    tenants: list[TenantConfig] = Field(default_factory=list)
    groups: list[GroupConfig] = Field(default_factory=list)
    quota: QuotaConfig = Field(default_factory=QuotaConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)

    @field_validator("models")
    @classmethod
    def _unique_models(cls, models: list[ModelConfig]) -> list[ModelConfig]:
        ids = [i for m in models for i in (m.id, m.embedding_id) if i is not None]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"duplicate model ids: {dupes}")
        return models

    @model_validator(mode="after")
    def _check_refs(self) -> Config:
        ids = {m.id for m in self.models}
        if self.server.default_model is not None and self.server.default_model not in ids:
            raise ValueError(
                f"server.default_model {self.server.default_model!r} is not a configured model"
            )
        for alias, target in self.server.model_aliases.items():
            if target not in ids:
                raise ValueError(f"server.model_aliases[{alias!r}]: {target!r} is not a "
                                 f"configured model")
            if alias in ids:
                raise ValueError(f"server.model_aliases[{alias!r}]: already a model id")
        by_id = {m.id: m for m in self.models}
        for g in self.groups:
            if g.id in by_id:
                raise ValueError(f"groups: {g.id!r} is also a model id")
            members = [by_id.get(v) for v in g.variants]
            missing = [v for v, m in zip(g.variants, members, strict=True) if m is None]
            if missing:
                raise ValueError(f"groups[{g.id!r}].variants: unknown models {missing}")
            shapes = {(m.kind, m.task) for m in members if m is not None}
            if len(shapes) != 1 or any(kind != "oneshot" for kind, _ in shapes):
                raise ValueError(f"groups[{g.id!r}].variants must be one-shot models of one "
                                 f"task, got {sorted(shapes)}")
        for m in self.models:
            if (m.faults is not None and m.faults.kill_mode != "raise"
                    and self.workers.isolation != "process"):
                raise ValueError(f"models[{m.id!r}].faults.kill_mode = "
                                 f"{m.faults.kill_mode!r} ends a process: it needs "
                                 f"workers.isolation = \"process\"")
        keys = [k for t in self.tenants for k in t.api_keys]
        if len(set(keys)) != len(keys):
            raise ValueError("tenants: an API key is listed for more than one tenant")
        return self

    @property
    def default_model(self) -> str:
        return self.server.default_model or self.models[0].id

    def runtime_config(self) -> RuntimeConfig:
        engine = EngineConfig(
            mode=self.engine.mode,
            max_batch_tokens=self.engine.max_batch_tokens,
            prefill_chunk_tokens=self.engine.prefill_chunk_tokens,
            kv_block_tokens=self.engine.kv_block_tokens,
            static_max_wait_s=self.engine.static_max_wait_ms / 1000.0,
            prefix_reuse=self.engine.prefix_reuse,
            min_prefix_tokens=self.engine.min_prefix_tokens,
            retain_prefixes=self.engine.retain_prefixes,
            max_retained_slots=self.engine.max_retained_slots,
            share_prefix_across_tenants=self.engine.share_prefix_across_tenants,
            line_order="priority_deadline" if self.scheduling.scheduler == "priority_edf"
            else "arrival",
        )
        workers = tuple(
            WorkerConfig(
                worker_id=i,
                budget_bytes=self.workers.budget_bytes,
                inbox_capacity=self.workers.inbox_capacity,
                eviction=self.workers.eviction,
                max_batch_size=self.batching.max_batch_size,
                max_wait_s=self.batching.max_wait_ms / 1000.0,
                engine=engine,
                watchdog_s=self.workers.watchdog_s,
                load_watchdog_s=self.workers.load_watchdog_s,
            )
            for i in range(self.workers.count)
        )
        return RuntimeConfig(
            models=tuple(s for m in self.models for s in m.specs()),
            workers=workers,
            scheduler=self.scheduling.scheduler,
            bypass_threshold=self.scheduling.bypass_threshold,
            router=self.scheduling.router,
            queue_capacity=self.scheduling.queue_capacity,
            tenant_weights={t.id: t.weight for t in self.tenants},
            faults={m.id: m.faults.plan() for m in self.models if m.faults is not None},
            trace_path=self.server.trace_file,
            isolation=self.workers.isolation,
            groups=tuple(
                GroupSpec(
                    group_id=g.id,
                    variants=tuple(g.variants),
                    planner=PlannerConfig(
                        policy=g.policy, pessimism=g.pessimism,
                        low_load_utilization=g.low_load_utilization,
                        low_load_confidence_z=g.low_load_confidence_z,
                        max_batch_size=self.batching.max_batch_size,
                    ),
                    default_deadline_s=None if g.default_deadline_ms is None
                    else g.default_deadline_ms / 1000.0,
                )
                for g in self.groups
            ),
        )


def hash_key(key: str) -> str:
    """How API keys are held in memory: SHA-256 hex digest, never the key itself."""
    return hashlib.sha256(key.encode()).hexdigest()


SECRET_FIELD_WORDS = ("key", "password", "secret", "token", "url", "credential")
"""A configuration field whose name holds one of these may hold a secret (``api_keys``,
``admin_key``, ``metrics_key``, ``redis_url`` with its password)."""


def describe_errors(exc: ValidationError) -> str:
    """A configuration's validation errors, one ``field: message`` line each, fit to print:
    the value is shown only for a known field that cannot hold a secret, and only when it
    is a number, a boolean or a short string. Pydantic's own text shows every input, a whole
    tenant's table with its keys included (the input of a tenant-level error)."""
    lines = [f"{exc.error_count()} invalid setting(s):"]
    for err in exc.errors(include_url=False, include_context=False):
        where = ".".join(str(part) for part in err["loc"]) or "(file)"
        secret = any(word in str(part).lower() for part in err["loc"]
                     for word in SECRET_FIELD_WORDS)
        value = err.get("input")
        shown = ""
        known = err["type"] != "extra_forbidden"  # a misspelt field may be a secret's
        if known and not secret and (isinstance(value, bool | int | float)
                           or (isinstance(value, str) and len(value) <= 80)):
            shown = f" (got {value!r})"
        lines.append(f"  {where}: {err['msg']}{shown}")
    return "\n".join(lines)


def load_config(path: str | Path) -> Config:
    """Parse and validate a TOML config file."""
    with open(path, "rb") as f:
        return Config.model_validate(tomllib.load(f))


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


def with_overrides(config: Config, overrides: dict[str, dict[str, Any]]) -> Config:
    """A copy of ``config`` with ``{section: {field: value}}`` applied and re-validated."""
    data = config.model_dump()
    for section, fields in overrides.items():
        data.setdefault(section, {}).update({k: v for k, v in fields.items() if v is not None})
    return Config.model_validate(data)
