"""A request's lifecycle: one status enum, one state machine, one event stream.

States go ``RECEIVED → QUEUED → RUNNING → terminal``; the first terminal transition wins
and every later one is a no-op (thread-safe). Listeners attached before submission see
every event exactly once, in order, ending with exactly one ``Final``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Literal

from sluice.policy.capacity.keep_alive import KeepAlive
from sluice.policy.step.ttft import request_start_by_s
from sluice.policy.variants.planner import VariantChoice


class RequestStatus(IntEnum):
    """Live states first, terminal states after ``RUNNING``."""

    RECEIVED = 0
    QUEUED = 1
    RUNNING = 2
    COMPLETED = 3
    FAILED = 4
    CANCELLED = 5
    REJECTED = 6
    EXPIRED = 7

    @property
    def is_terminal(self) -> bool:
        return self >= RequestStatus.COMPLETED


#: The finish reason clients see for each terminal state that has no better one.
FINISH_REASON: dict[RequestStatus, str] = {
    RequestStatus.COMPLETED: "stop",
    RequestStatus.FAILED: "error",
    RequestStatus.CANCELLED: "cancelled",
    RequestStatus.REJECTED: "rejected",
    RequestStatus.EXPIRED: "deadline",
}


@dataclass(frozen=True, slots=True)
class Constraint:
    """What decoding must produce; compiled by the engine's grammar engine."""

    kind: Literal["json_object", "json_schema", "regex", "lark"]
    spec: str = ""
    """JSON schema text (json_schema), a regex, or a lark grammar."""
    strict: bool = False
    """json_schema "strict" (additionalProperties false etc.)."""


@dataclass(frozen=True, slots=True)
class ThinkingLimit:
    """How long a sequence may think: ``budget_tokens`` inside ``start`` … ``end`` (inside
    from the first token when ``opened``), then ``end_tokens`` are forced."""

    start: str
    end: str
    end_tokens: tuple[int, ...]
    budget_tokens: int
    opened: bool = False


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick tokens and when to stop."""

    max_tokens: int = 16
    """Tokens to generate at most."""
    temperature: float = 1.0
    """0 means greedy."""
    top_p: float = 1.0
    top_k: int = 0
    """0 means no top-k cut."""
    seed: int | None = None
    stop: tuple[str, ...] = ()
    """Generation ends before the first occurrence of any of these strings."""
    ignore_eos: bool = False
    """Keep generating past end-of-sequence (benchmarks)."""
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    """llama.cpp's meaning (divide positive logits, multiply negative)."""
    penalty_last_n: int = 64
    """Window of recent tokens the penalties look at (llama.cpp default)."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias); -100 bans."""
    logprobs: bool = False
    """Report each sampled token's logprob."""
    top_logprobs: int = 0
    """0..20 alternatives per token."""
    prompt_logprobs: bool = False
    """Completions echo: logprob of every prompt token (first is None)."""
    n: int = 1
    """Choices sharing one prefill."""
    constraint: Constraint | None = None
    thinking: ThinkingLimit | None = None
    """A budget of thinking tokens (``engine.thinking``); ``None``: no limit."""
    post_sampling_probs: bool = False
    """With ``logprobs``: report probabilities after the sampler chain (``TokenEvent.prob``
    and ``top_probs``, ``top_logprobs`` of them), the distribution the token was drawn
    from, instead of the model's log-probabilities (llama-server's ``post_sampling_probs``)."""
    speculation: bool = True
    """May the engine draft tokens for it (n-gram speculation, greedy requests only, when
    the model's ``speculation`` is ``auto``); False: never. Output is the same either way."""


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token_id: int
    logprob: float


@dataclass(frozen=True, slots=True)
class TokenProb:
    """A token's probability after the sampler chain (0 < ``prob`` <= 1 for a candidate)."""

    token_id: int
    prob: float


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One generated token; ``text`` is what became safe to show (may be empty)."""

    index: int
    token_id: int
    text: str
    time_s: float
    choice: int = 0
    """Which of the n choices."""
    logprob: float | None = None
    """Set when params.logprobs."""
    top_logprobs: tuple[TokenLogprob, ...] = ()
    """params.top_logprobs best, most likely first."""
    prob: float | None = None
    """Set when params.post_sampling_probs: the token's probability after the chain."""
    top_probs: tuple[TokenProb, ...] = ()
    """params.post_sampling_probs: the chain's most likely kept candidates, most likely
    first."""


@dataclass(frozen=True, slots=True)
class PromptProgress:
    """How far the engine has computed a request's prompt (llama-server's
    ``prompt_progress``): ``processed`` of its ``total`` prompt tokens are in the KV cache,
    ``cache`` of them reused rather than computed, at ``time_s``. Sent only for a request
    that asks (``Request.report_progress``): once when it starts (``processed`` ==
    ``cache``), then after every forward pass that feeds its prompt (the last has
    ``processed`` == ``total``), before its first token."""

    total: int
    cache: int
    processed: int
    time_s: float


@dataclass(frozen=True, slots=True)
class ChoiceFinal:
    index: int
    text: str
    finish_reason: str
    """"stop" | "length" | ..."""
    completion_tokens: int
    stop_sequence: str | None = None
    """The stop string that ended this choice (``None``: EOS, grammar, length, ...)."""


@dataclass(frozen=True, slots=True)
class Final:
    """The one terminal event of a request."""

    status: RequestStatus
    finish_reason: str
    result: Any = None
    """One-shot output (embedding vector, label scores) when completed."""
    text: str = ""
    """Generated text for generative requests (stop strings removed)."""
    error: str | None = None
    error_code: str | None = None
    """Machine-readable cause: ``queue_full``, ``backend_error``, ``deadline`` ..."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    choices: tuple[ChoiceFinal, ...] = ()
    """Every choice when n > 1 (index order); () when n == 1."""
    prompt_logprobs: tuple[TokenLogprob | None, ...] = ()
    """When params.prompt_logprobs (first None)."""
    retry_after_s: float | None = None
    """A refusal's computed suggestion of when to retry (``None``: no suggestion)."""
    stop_sequence: str | None = None
    """The stop string that ended choice 0 (``None``: EOS, grammar, length, ...)."""


Event = TokenEvent | PromptProgress | Final
Listener = Callable[[Event], None]


@dataclass(slots=True)
class Timestamps:
    """Monotonic times of each transition; ``None`` until it happens."""

    arrival_s: float
    queued_s: float | None = None
    started_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None


@dataclass(eq=False)
class Request:
    """One inference request and its state machine.

    Invariants: ``status`` only moves forward; once terminal it never changes and exactly
    one ``Final`` has been delivered to every listener.
    """

    request_id: int
    model_id: str
    kind: str
    """``generative`` or ``oneshot``."""
    arrival_s: float
    prompt_tokens: tuple[int, ...] = ()
    """Generative: the tokenized prompt."""
    input: Any = None
    """One-shot: the single input (e.g. a text)."""
    params: SamplingParams = field(default_factory=SamplingParams)
    tenant_id: str = "default"
    priority: int = 5
    deadline_s: float | None = None
    ttft_deadline_s: float | None = None
    """Generative: when its first token is due; one that cannot start in time is refused
    (``deadline_infeasible``) or ended (``deadline``), never left waiting past it."""
    ttft_target_s: float | None = None
    """Generative: when its first token is wanted (soft): the engine widens its batch past
    the TPOT budget to start the line by it, and refuses on arrival one predicted to miss
    it even so (``deadline_infeasible``, with a Retry-After); once admitted it is never
    ended for being late."""
    keep_alive: KeepAlive | None = None
    """What its model does once idle after it (Ollama's ``keep_alive``); ``None``: the
    model's configured keep-alive."""
    report_progress: bool = False
    """Generative: its listeners also get ``PromptProgress`` events while the engine
    computes its prompt."""
    listeners: list[Listener] = field(default_factory=list)
    # Decision record, filled as the request moves through the system.
    worker_id: int | None = None
    variant: str | None = None
    predicted_wait_s: float | None = None
    plan: VariantChoice | None = None
    """The planner's choice for a request that named a model group (kept as made: a
    re-planned request runs on another ``variant`` than ``plan.variant``)."""
    batch_size: int | None = None
    """One-shot: the size of the batch it ran in."""
    route_reason: str = ""
    cancel_requested: bool = False
    """Set from any thread; the owner of the request stops it at its next check."""
    status: RequestStatus = RequestStatus.RECEIVED
    final: Final | None = None
    times: Timestamps = field(init=False)
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0
    """Generative: prompt tokens whose KV was reused (a running sequence's or a retained
    prefix) instead of computed; set by the engine as it admits the request."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.times = Timestamps(arrival_s=self.arrival_s)

    @property
    def is_terminal(self) -> bool:
        return self.status.is_terminal

    @property
    def start_by_s(self) -> float | None:
        """The time past which it is no use starting it or letting it wait on: its
        deadline, or its first-token deadline while no token has come."""
        return request_start_by_s(self.deadline_s, self.ttft_deadline_s,
                                  self.times.first_token_s)

    @property
    def first_token_due_s(self) -> float | None:
        """The earlier of its first-token target and deadline (None: neither)."""
        return _earliest(self.ttft_target_s, self.ttft_deadline_s)

    def missed_start(self, now: float) -> bool:
        """Whether ``now`` is past ``start_by_s``."""
        start_by = self.start_by_s
        return start_by is not None and now >= start_by

    def mark_queued(self, now: float) -> bool:
        """RECEIVED → QUEUED; False if the request already ended."""
        with self._lock:
            if self.status != RequestStatus.RECEIVED:
                return False
            self.status = RequestStatus.QUEUED
            self.times.queued_s = now
            return True

    def mark_running(self, now: float) -> bool:
        """QUEUED → RUNNING; False if it already ended (or was cancelled meanwhile)."""
        with self._lock:
            if self.status.is_terminal or self.cancel_requested:
                return False
            self.status = RequestStatus.RUNNING
            self.times.started_s = now
            return True

    def emit_token(self, event: TokenEvent) -> None:
        """Deliver a token to the listeners (only while running)."""
        with self._lock:
            if self.status != RequestStatus.RUNNING:
                return
            if self.times.first_token_s is None:
                self.times.first_token_s = event.time_s
            if event.token_id >= 0:  # not the text a retiring sequence flushes
                self.completion_tokens += 1  # every choice's tokens count
            listeners = tuple(self.listeners)
        for listener in listeners:
            listener(event)

    def emit_progress(self, progress: PromptProgress) -> None:
        """Deliver prompt progress to the listeners (only while running)."""
        with self._lock:
            if self.status != RequestStatus.RUNNING:
                return
            listeners = tuple(self.listeners)
        for listener in listeners:
            listener(progress)

    def finish(self, status: RequestStatus, now: float, **final: Any) -> bool:
        """Move to a terminal state. The first call wins and returns True; later calls
        return False and change nothing."""
        if not status.is_terminal:
            raise ValueError(f"status {status.name} is not terminal")
        final.setdefault("finish_reason", FINISH_REASON[status])
        final.setdefault("prompt_tokens", len(self.prompt_tokens))
        final.setdefault("completion_tokens", self.completion_tokens)
        return self.end(Final(status=status, **final), now)

    def end(self, event: Final, now: float) -> bool:
        """``finish`` with the terminal event already made (one a worker sent)."""
        with self._lock:
            if self.status.is_terminal:
                return False
            self.status = event.status
            self.final = event
            self.times.finished_s = now
            listeners = tuple(self.listeners)
        for listener in listeners:
            listener(event)
        return True


def is_stopped(req: Request, now: float) -> bool:
    """Whether ``req`` must not start: ended, cancelled, or past its deadline."""
    return req.is_terminal or req.cancel_requested or req.missed_start(now)


def end_stopped(req: Request, now: float, where: str) -> None:
    """Give a request that must not run its terminal state (no-op if it has one);
    ``where`` completes the message, e.g. ``"while queued at the worker"``."""
    if req.cancel_requested:
        req.finish(RequestStatus.CANCELLED, now, error=f"cancelled {where}")
    elif req.missed_start(now):
        req.finish(RequestStatus.EXPIRED, now, error=f"{expired_what(req, now)} passed {where}",
                   error_code="deadline")


def expired_what(req: Request, now: float) -> str:
    """Which deadline ``req`` has missed at ``now``: ``deadline`` or ``first-token
    deadline``."""
    if req.deadline_s is not None and now >= req.deadline_s:
        return "deadline"
    return "first-token deadline"


def _earliest(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else min(a, b)
