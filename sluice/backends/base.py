"""The backend protocol: what the engine asks of a model runtime.

Two kinds of loaded model exist. A ``OneShotModel`` maps a batch of inputs to a batch of
outputs in one call (encoders, classifiers). A ``GenerativeModel`` exposes the primitive
the continuous-batching engine needs: one forward pass over a set of token chunks, each
belonging to a sequence slot, returning logits for the chunks that ask for them. The
engine (not the backend) owns admission, sampling, stopping and retirement.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, NamedTuple, Protocol, TypeVar, runtime_checkable

import numpy as np

from sluice.backends.chat import ChatPrompt, RenderOptions

ModelKind = Literal["oneshot", "generative"]


@dataclass(frozen=True)
class ModelSpec:
    """A configured model: how big it is, what it costs to load, and how to build it."""

    model_id: str
    """The name clients use."""
    kind: ModelKind
    """``oneshot`` (batched single call) or ``generative`` (token by token)."""
    backend: str
    """Which backend builds it: ``synthetic``, ``llamacpp`` or ``onnx``."""
    memory_bytes: int
    """Estimated resident memory, for residency decisions."""
    load_cost_s: float = 1.0
    """Estimated time to load, for cost-aware eviction."""
    task: str = "embedding"
    """For one-shot models: ``embedding``, ``classification`` or ``rerank`` (each input a
    ``RerankPair``, each output a ``RerankScore``)."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """Backend-specific settings (paths, thread counts, cost model, ...)."""
    tpot_target_s: float | None = None
    """Generative models: the time per output token every running sequence should stay
    within; the engine admits and sizes prefill chunks by its step-time model to keep it
    (``None``: no limit beyond the token budget)."""
    ttft_deadline_s: float | None = None
    """Generative models: the first-token deadline of a request that brings none (and
    whose tenant sets none); ``None``: no deadline."""
    ttft_target_s: float | None = None
    """Generative models: the first-token target (soft) of a request that brings none (and
    whose tenant sets none): the engine widens past the TPOT budget to start its line by
    it and refuses on arrival what would miss it even so; ``None``: no target."""
    step_cost_path: str | None = None
    """Generative models: a profiled ``StepCost`` JSON, the prior of the learned step-time
    model (``None``: ``step_cost_warmup``, else a rough default, refined online within
    seconds)."""
    step_cost_warmup: bool = False
    """Generative models without ``step_cost_path``: measure the prior at load from a short
    warm-up of real steps (``sluice.engine.step_warmup``)."""
    keep_alive_s: float | None = None
    """Seconds idle (nothing running or queued for it) before it is unloaded; ``None``: it
    stays until evicted to make room. A request's ``keep_alive`` overrides it."""
    pinned: bool = False
    """Never unloaded by time nor evicted for another model (requests cannot unpin it)."""
    reasoning: ReasoningFormat | None = None
    """Generative models that think in tags: how, so each API can split the thinking from
    the answer (``None``: the output is all answer)."""
    speculation: Literal["auto", "off"] = "auto"
    """Generative models: ``auto`` drafts tokens from each greedy sequence's own prompt and
    output (n-gram lookup) and verifies them in the decode step, as many per step as the
    step-time model says pay (``sluice.policy.step.speculation``); ``off``: never."""
    draft_max_tokens: int = 16
    """Generative models: the most tokens one sequence drafts in a step (llama-server's
    ``--draft-max``)."""

    sampling: Mapping[str, float | int] = field(default_factory=dict)
    """Generative models: the configured sampling defaults (``[models.sampling]``), for the
    fields a request leaves out and the model file does not set
    (``sluice.engine.sampling_defaults``)."""
    sampling_over_model: bool = False
    """``sampling`` wins over the model file's recommendation (llama-server's flags)."""
    default_max_tokens: int | None = None
    """Generative models: the token limit of a request that names none (``-1``: until the
    context is full; ``None``: the server's default)."""
    embedding_model: str | None = None
    """Generative models that also embed: the one-shot model that does it."""

@dataclass(frozen=True)
class ReasoningFormat:
    """How a model marks its thinking, and what a request gets by default."""

    start: str = "<think>"
    end: str = "</think>"
    opened: bool = False
    """The template opens the thinking itself (the output starts inside it)."""
    enabled: bool = True
    """Thinking on unless a request turns it off."""
    budget_tokens: int | None = None
    """Thinking tokens a request gets unless it asks for another budget (``None``: no
    limit but ``max_tokens``)."""


def thinking_default(reasoning: ReasoningFormat | None) -> bool:
    """What a chat template sees as ``enable_thinking`` when a request does not say: the
    model's configured default, else true (as llama-server's ``--reasoning auto`` gives a
    template that supports thinking; a template that does not read it is unchanged)."""
    return True if reasoning is None else reasoning.enabled


def resolved_options(spec: ModelSpec, options: RenderOptions | None) -> RenderOptions:
    """``options`` (default: a generation prompt) with ``enable_thinking`` the model's
    ``thinking_default`` where the request leaves it unset."""
    options = options or RenderOptions()
    if options.enable_thinking is not None:
        return options
    return replace(options, enable_thinking=thinking_default(spec.reasoning))


class ModelLoadError(RuntimeError):
    """A model could not be loaded (missing or corrupt file, injected fault, ...)."""


class NoChatTemplateError(ValueError):
    """A chat request to a completion model: its file has no chat template and none is
    configured (the server answers 400 ``model_has_no_chat_template``)."""


class BackendError(RuntimeError):
    """A model failed while running a batch or a decode step."""


class RerankPair(NamedTuple):
    """The input of a ``rerank`` model: one document to score against a query."""

    query: str
    document: str


def rerank_pairs(inputs: Sequence[Any]) -> list[RerankPair]:
    """A rerank model's batch as pairs; ``BackendError`` for anything else (the routes
    send a ``rerank`` model nothing but pairs)."""
    if not all(isinstance(x, tuple) and len(x) == 2 and all(isinstance(t, str) for t in x)
               for x in inputs):
        raise BackendError("a rerank model takes (query, document) pairs")
    return [RerankPair(*x) for x in inputs]


class RerankScore(NamedTuple):
    """The output of a ``rerank`` model for one ``RerankPair``: higher is more relevant
    (the scale is the model's), and the tokens its query and its document ran as."""

    score: float
    query_tokens: int
    document_tokens: int


@dataclass(frozen=True, slots=True)
class EmbedInput:
    """One input of an ``embedding`` model given as more than a text: token ids and texts
    in order (each text tokenized where it stands, after BOS: llama-server's mixed prompt;
    OpenAI's token-id input is all ids), and whether an input longer than the model's
    context is cut to it (``truncate``, Ollama's default) rather than refused. A plain
    ``str`` input means ``EmbedInput((text,))``: refused when too long."""

    pieces: tuple[int | str, ...]
    truncate: bool = False

    @property
    def text(self) -> str | None:
        """The input as one text when it holds no token ids, else ``None``."""
        if all(isinstance(p, str) for p in self.pieces):
            return "".join(p for p in self.pieces if isinstance(p, str))
        return None


def embed_input(x: Any) -> EmbedInput:
    """An embedding model's input as an ``EmbedInput`` (a ``str`` becomes one piece)."""
    return x if isinstance(x, EmbedInput) else EmbedInput((str(x),))


class InputError(NamedTuple):
    """What a one-shot model returns in place of an output for an input it cannot run,
    while the rest of its batch runs: that request alone fails with the API error ``code``
    (``context_length_exceeded``, ``invalid_request_error``) and ``message``."""

    code: str
    message: str


_Prepared = TypeVar("_Prepared")
_Output = TypeVar("_Output")


def run_valid(prepared: Sequence[_Prepared | InputError],
              run: Callable[[list[_Prepared]], Sequence[_Output]]
              ) -> list[_Output | InputError]:
    """A one-shot batch whose inputs each prepared to a value or an ``InputError``: ``run``
    over the values (not called when there are none), its outputs put back in order
    beside the errors."""
    valid = [p for p in prepared if not isinstance(p, InputError)]
    done = iter(run(valid) if valid else ())
    return [p if isinstance(p, InputError) else next(done) for p in prepared]


class Embedding(NamedTuple):
    """The output of an ``embedding`` model for one input: its vector, and the tokens the
    model read for it (after truncation, special tokens included), which is what the
    embedding routes report as usage."""

    vector: list[float]
    n_tokens: int


@dataclass(frozen=True, slots=True)
class ForwardChunk:
    """Tokens of one sequence to feed in one forward pass.

    ``tokens`` occupy positions ``start_pos .. start_pos + len(tokens) - 1`` of the
    sequence in slot ``seq_slot``. When ``want_logits`` is set the backend returns the
    logits after the chunk's last token; when ``all_logits`` is set it returns the logits
    after every token of the chunk (``len(tokens)`` rows, in position order: prompt
    log-probabilities), whatever ``want_logits`` says.
    """

    seq_slot: int
    tokens: tuple[int, ...]
    start_pos: int
    want_logits: bool
    all_logits: bool = False
    draft_tokens: int = 0
    """The last ``draft_tokens`` of ``tokens`` are drafted (speculative decoding: the engine
    verifies each from the logits row before it, with ``all_logits`` set). A backend feeds
    them as any other tokens; the engine removes the KV of those it rejects with
    ``trim_sequence``."""

    @property
    def n_rows(self) -> int:
        """Logits rows this chunk adds to the forward's output."""
        if self.all_logits:
            return len(self.tokens)
        return 1 if self.want_logits else 0


@dataclass(frozen=True, eq=False)
class TokenTable:
    """Every token of a vocabulary, as a grammar engine needs it. Compared and hashed by
    identity: tokenizers of one model file share one table, and caches key on it."""

    pieces: tuple[bytes, ...]
    """``pieces[t]``: the bytes token ``t`` adds to generated text; for a special token,
    its name (e.g. ``b"<eos>"``)."""
    special: frozenset[int]
    """Control tokens (BOS, EOS, turn markers, unknown): never part of generated text."""


@dataclass(frozen=True, slots=True)
class FimTokens:
    """A model's fill-in-the-middle tokens (a GGUF's ``tokenizer.ggml.fim_*_token_id``):
    prefix, suffix and middle are required for infill; the repository and file-separator
    tokens of the repo-level pattern are optional."""

    prefix: int
    suffix: int
    middle: int
    repo: int | None = None
    file_sep: int | None = None


@runtime_checkable
class OneShotModel(Protocol):
    """A loaded model that answers a whole batch in one call."""

    spec: ModelSpec

    def run_batch(self, inputs: Sequence[Any]) -> list[Any]:
        """One output per input, in order: an ``InputError`` for an input that fails
        alone. Raises ``BackendError`` when the batch fails."""
        ...

    def close(self) -> None:
        """Release the model's memory. Idempotent."""
        ...


@runtime_checkable
class Tokenizer(Protocol):
    """Text ↔ tokens for a generative model, usable without loading its weights."""

    n_ctx_per_seq: int
    n_seq_max: int
    vocab_size: int
    eos_token_ids: frozenset[int]
    chat_template: str | None
    """The chat template's name; ``None``: a completion model (no template in its file and
    none configured), to which chat requests are refused."""
    model_sampling: Mapping[str, float | int]
    """The model file's recommended sampling (a GGUF's ``general.sampling.*``), by
    ``SamplingParams`` field name; empty when it recommends none."""
    fim_tokens: FimTokens | None
    """Its fill-in-the-middle tokens; ``None``: it lacks one of prefix, suffix and middle,
    so it cannot infill."""

    def tokenize(self, text: str, *, add_bos: bool, special: bool = True) -> list[int]:
        """Token ids of ``text``; ``special``: text such as ``<start_of_turn>`` becomes its
        special token (else it is plain text)."""
        ...

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token contributes to the output text."""
        ...

    def token_table(self) -> TokenTable:
        """Every token's bytes and which are special (for grammar engines; built once,
        then cached by the tokenizer)."""
        ...

    def max_token_bytes(self) -> int | None:
        """The most bytes of input text one token can stand for (the longest piece, special
        tokens by name), so a text of ``n`` bytes has at least ``n / max_token_bytes()``
        tokens; ``None`` when no such bound holds. May build the token table: call it off
        the event loop."""
        ...

    def render_chat(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """The prompt text for a chat conversation, ending where the assistant replies."""
        ...

    def apply_chat(self, messages: Sequence[Mapping[str, Any]],
                   tools: Sequence[Mapping[str, Any]] | None = None,
                   options: RenderOptions | None = None) -> ChatPrompt:
        """The conversation (OpenAI message shapes) with ``tools`` offered, as template
        markup and plain user text; tokenize it with ``chat.chat_tokens``. ``options``:
        the generation prompt and thinking switch (default: a generation prompt, the
        model's ``thinking_default``). ``ValueError`` (fit for a client) if the template
        refuses the messages."""
        ...


@runtime_checkable
class GenerativeModel(Tokenizer, Protocol):
    """A loaded language model driven one forward pass at a time; it is also its own
    ``Tokenizer``.

    Invariants: at most ``n_seq_max`` sequence slots exist (``0 .. n_seq_max-1``); a slot
    holds at most ``n_ctx_per_seq`` tokens; ``release_sequence`` drops a slot's KV so the
    slot can be reused from position 0.
    """

    spec: ModelSpec
    n_ctx_total: int
    kv_unified: bool
    """One KV pool any sequence may fill (``n_ctx_per_seq == n_ctx_total``), else a fixed
    stream per slot."""

    def forward(self, chunks: Sequence[ForwardChunk]) -> np.ndarray:
        """Run one forward pass; return float32 logits, ``chunk.n_rows`` rows per chunk
        (in chunk order; one for ``want_logits``, one per token for ``all_logits``), shape
        ``(sum of n_rows, vocab_size)``.

        The array may be the backend's own output buffer (llama.cpp's logits: no copy of
        a vocabulary-wide row per sequence each step): it is valid until the next call
        on this model; a caller copies what must outlive that."""
        ...

    def release_sequence(self, seq_slot: int) -> None:
        """Forget the KV of a slot."""
        ...

    def copy_sequence(self, src_slot: int, dst_slot: int, n_tokens: int) -> None:
        """Make the first ``n_tokens`` positions of ``dst_slot`` share ``src_slot``'s KV."""
        ...

    def trim_sequence(self, seq_slot: int, n_tokens: int) -> None:
        """Keep the first ``n_tokens`` positions of a slot's KV and forget the rest."""
        ...

    def save_sequence(self, seq_slot: int, path: Path, tokens: Sequence[int]) -> int:
        """Write the slot's KV and ``tokens`` (exactly the tokens it holds) to ``path``;
        returns the bytes written. ``BackendError`` if it cannot."""
        ...

    def load_sequence(self, seq_slot: int, path: Path) -> tuple[list[int], int]:
        """Replace the slot's KV with a file ``save_sequence`` wrote (of this model, fitting
        a slot): ``(the tokens it now holds, bytes read)``. ``BackendError`` (the slot left
        empty) for any other file."""
        ...

    def sequence_state(self, seq_slot: int) -> bytes:
        """The slot's KV as bytes (what it holds now), for ``set_sequence_state`` on this
        model to put back. ``BackendError`` if it cannot."""
        ...

    def set_sequence_state(self, seq_slot: int, state: bytes, n_tokens: int) -> None:
        """Replace the slot's KV with ``sequence_state``'s bytes of a slot that held
        ``n_tokens``. ``BackendError`` (the slot left empty) if they do not fit."""
        ...

    def close(self) -> None:
        """Release the model. Idempotent."""
        ...


LoadedModel = OneShotModel | GenerativeModel


class Backend(Protocol):
    """Builds loaded models from specs. Called on a worker's execution thread."""

    name: str

    def load(self, spec: ModelSpec) -> LoadedModel:
        """Load the model; raise ``ModelLoadError`` with a clear message on failure."""
        ...

    def load_tokenizer(self, spec: ModelSpec) -> Tokenizer:
        """A tokenizer for a generative spec, cheap to hold beside the control plane."""
        ...
