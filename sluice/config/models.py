"""The ``[[models]]`` and ``[[groups]]`` tables: one servable model (with its sampling
defaults, reasoning tags, embeddings and injected faults), and a group of variants."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, Field, field_validator, model_validator

from sluice.backends.base import ModelSpec, ReasoningFormat
from sluice.backends.faults import FaultPlan
from sluice.config._base import _Strict
from sluice.config.sampling import (
    MinP,
    Penalty,
    PenaltyLastN,
    RepetitionPenalty,
    Temperature,
    TopK,
    TopP,
)
from sluice.policy.capacity.keep_alive import PINNED, STAY, parse_keep_alive


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

    temperature: Temperature | None = None
    top_k: TopK | None = None
    top_p: TopP | None = None
    min_p: MinP | None = None
    repetition_penalty: RepetitionPenalty | None = Field(
        default=None, validation_alias=AliasChoices("repetition_penalty", "repeat_penalty"))
    penalty_last_n: PenaltyLastN | None = Field(
        default=None, validation_alias=AliasChoices("penalty_last_n", "repeat_last_n"))
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
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
RERANK_SUFFIX = ":rerank"
"""... and reranks through ``m:rerank`` when its ``pooling`` is ``rank``."""


class EmbeddingsConfig(_Strict):
    """Embeddings from a generative GGUF (llama-server's ``--embedding``): a second llama.cpp
    context over the same file with embeddings on, pooled per input and L2-normalised; a
    one-shot model of its own in residency (loaded on first use, evicted like any other)."""

    pooling: Literal["mean", "cls", "last", "rank"] | None = None
    """How the token states of an input become one vector (llama-server's ``--pooling``);
    unset: the file's own (``<arch>.pooling_type``), else ``mean``. ``rank``
    (llama-server's ``--reranking``): the model reranks instead, as ``<id>:rerank`` on
    ``/v1/rerank``, scoring each (query, document) with the file's classifier head."""
    n_ctx: int = Field(default=2048, ge=16, le=1_048_576)
    """Tokens of one input at most (a longer one is refused, unless Ollama's ``truncate``
    asks for the cut); also the tokens of one forward pass."""
    memory_bytes: int | None = Field(default=None, gt=0)
    """Its resident size; unset: worked out from the file by ``sluice serve FILE.gguf``,
    else the generative model's ``memory_bytes`` (the same weights, an upper bound)."""

    @property
    def reranks(self) -> bool:
        return self.pooling == "rank"

    def spec(self, model_id: str, of: ModelSpec) -> ModelSpec:
        """The one-shot spec that embeds (or reranks) for the generative model ``of``."""
        keys = ("path", "n_threads", "n_gpu_layers", "verbose", "extra_bufts")
        options: dict[str, Any] = {k: of.options[k] for k in keys if k in of.options}
        options.update(n_ctx=self.n_ctx, n_batch=self.n_ctx, kv_unified=True)
        if self.pooling is not None:
            options["pooling"] = self.pooling
        return ModelSpec(
            model_id=model_id, kind="oneshot", backend="llamacpp",
            task="rerank" if self.reranks else "embedding",
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
                             f"not a {self.kind} {self.backend} one (a reranker GGUF: a "
                             f"generative model with [models.embeddings] pooling = \"rank\")")
        if self.embeddings is not None and (self.backend != "llamacpp"
                                            or self.kind != "generative"):
            raise ValueError(f"embeddings: only a generative llamacpp model embeds this way "
                             f"(got {self.kind} {self.backend}); configure an embedding "
                             f"model of its own instead")
        return self

    @property
    def embedding_id(self) -> str | None:
        """The id of the one-shot model that embeds for this one (``None``: it does not)."""
        if self.embeddings is None or self.embeddings.reranks:
            return None
        return f"{self.id}{EMBEDDING_SUFFIX}"

    @property
    def rerank_id(self) -> str | None:
        """The id of the one-shot model that reranks for this one (``None``: it does not)."""
        if self.embeddings is None or not self.embeddings.reranks:
            return None
        return f"{self.id}{RERANK_SUFFIX}"

    def specs(self) -> list[ModelSpec]:
        """This model's spec, and its embedding (or rerank) model's after it."""
        spec = self.spec()
        companion = self.embedding_id or self.rerank_id
        if self.embeddings is None or companion is None:
            return [spec]
        return [spec, self.embeddings.spec(companion, spec)]

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
