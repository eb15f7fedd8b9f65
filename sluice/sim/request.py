"""A simulated request: the lifecycle of a real one, on the virtual clock.

States as in the server: queued → running → one terminal state (``completed``,
``rejected``, ``expired``, ``failed``); the first terminal transition wins and a second
one is an error here (the conservation check: every request ends exactly once).
"""

from __future__ import annotations

from sluice.policy.step.ttft import request_start_by_s

TERMINAL = ("completed", "rejected", "expired", "failed")

_ID_SPAN = 1 << 20
"""Prompt token ids of request ``r`` are ``r * _ID_SPAN + i``: unique per request, so two
prompts share a prefix only when their workload says so."""


class SimRequest:
    """One request's identity, sizes, decisions and times (seconds, virtual clock)."""

    __slots__ = (
        "_prompt",
        "arrival_s",
        "batch_size",
        "deadline_s",
        "end_s",
        "enqueued_s",
        "first_token_s",
        "generated",
        "group",
        "input_chars",
        "max_tokens",
        "model",
        "n_prompt",
        "plan_arrival",
        "plan_reason",
        "prefix_id",
        "prefix_tokens",
        "priority",
        "quota_tokens",
        "reason",
        "replica",
        "request_id",
        "started_s",
        "status",
        "tenant",
        "ttft_deadline_s",
        "ttft_target_s",
        "waiting_ahead",
        "worker",
    )

    def __init__(self, request_id: int, model: str, arrival_s: float, *, tenant: str = "default",
                 priority: int = 5, deadline_s: float | None = None, n_prompt: int = 16,
                 max_tokens: int = 16, prefix_id: int | None = None,
                 prefix_tokens: int = 0, input_chars: int = 0) -> None:
        self.request_id = request_id
        self.model = model
        """The model it runs on (a group request is rewritten to the chosen variant)."""
        self.group: str | None = None
        self.arrival_s = arrival_s
        self.tenant = tenant
        self.priority = priority
        self.deadline_s = deadline_s
        """Absolute deadline, or ``None``."""
        self.ttft_deadline_s: float | None = None
        """Generative: absolute first-token deadline (the model's default), or ``None``."""
        self.ttft_target_s: float | None = None
        """Generative: absolute first-token target (the model's default, soft: the server's
        ``Request.ttft_target_s``), or ``None``."""
        self.n_prompt = max(1, n_prompt)
        self.max_tokens = max(1, max_tokens)
        self.prefix_id = prefix_id
        self.prefix_tokens = prefix_tokens
        self.input_chars = input_chars
        """One-shot: the input's length in characters (0: unknown)."""
        self.batch_size = 0
        """One-shot: the size of the batch it ran in (0: it did not run)."""
        self.plan_reason: str | None = None
        """A group request: why the planner chose its variant (``VariantChoice.reason``,
        ``replanned`` once moved), as the server's ``x-sluice-plan-reason``."""
        self.plan_arrival: tuple[float, float, float] | None = None
        """A group request: the low-load test's inputs at its planning (arrival rate, its
        standard error, the line; per second), as the server's ``x-sluice-plan-arrival``."""
        self.status = "received"
        self.reason: str | None = None
        """Error code of a terminal state other than ``completed``."""
        self.enqueued_s = arrival_s
        self.started_s: float | None = None
        self.first_token_s: float | None = None
        self.end_s: float | None = None
        self.generated = 0
        self.replica = -1
        self.worker = -1
        self.quota_tokens = 0.0
        self.waiting_ahead = 0
        """Requests its replica held admitted and not yet running when it arrived (the
        autoscaler's ``sluice_requests_waiting``)."""
        self._prompt: tuple[int, ...] | None = None

    @property
    def prompt(self) -> tuple[int, ...]:
        """Prompt token ids (built on first use; only generative models read them)."""
        if self._prompt is None:
            n, shared = self.n_prompt, 0
            head: tuple[int, ...] = ()
            if self.prefix_id is not None and self.prefix_tokens > 0:
                shared = min(self.prefix_tokens, n)
                base = -(self.prefix_id + 1) * _ID_SPAN
                head = tuple(range(base, base + shared))
            base = self.request_id * _ID_SPAN
            self._prompt = head + tuple(range(base + shared, base + n))
        return self._prompt

    @property
    def start_by_s(self) -> float | None:
        """Past this it is no use starting it or letting it wait on (as the server's
        ``Request.start_by_s``): its deadline, or its first-token deadline while no token
        has come, whichever is earlier."""
        return request_start_by_s(self.deadline_s, self.ttft_deadline_s, self.first_token_s)

    @property
    def first_token_due_s(self) -> float | None:
        """The earlier of its first-token target and deadline (None: neither)."""
        due = [t for t in (self.ttft_target_s, self.ttft_deadline_s) if t is not None]
        return min(due) if due else None

    def missed_start(self, now: float) -> bool:
        start_by = self.start_by_s
        return start_by is not None and now >= start_by

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL

    def finish(self, status: str, now: float, reason: str | None = None) -> None:
        """Enter terminal ``status`` at ``now``; ``RuntimeError`` if it already ended (the
        simulator must never end a request twice)."""
        if self.status in TERMINAL:
            raise RuntimeError(f"request {self.request_id} ended twice: {self.status} then "
                               f"{status}")
        self.status = status
        self.reason = reason
        self.end_s = now
