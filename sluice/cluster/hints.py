"""What the front end reads from a request to route it: the model, and a fingerprint of the
prompt's first characters.

The front end does not tokenize (it holds no model); it fingerprints the prompt text as the
API carries it — a chat's messages in order (role and text), a completion's prompt, the
native ``input`` — which is what the replica's chat template and tokenizer turn into the
tokens whose prefix its engine can share. Anything it cannot read routes without a key
(least loaded among the replicas that hold the model); the replica then validates the body
and answers the error, so a malformed request costs no routing logic.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sluice.policy.queues.replica_router import ReplicaRequest, prefix_fingerprint

PROMPT_PATHS = {"/v1/chat/completions", "/v1/completions", "/v1/infer", "/v1/embeddings"}
"""Paths whose body names a model and carries a prompt."""


@dataclass
class RouteHint:
    """Travels with the request to the replica deployment: read by the request router,
    which records its ranking reasons in it before the request is sent, so the replica
    that gets it can say why (``x-sluice-replica-route``)."""

    model_id: str
    prefix_key: str | None = None
    exclude: frozenset[str] = frozenset()
    """Replicas that refused this request a moment ago (tried last)."""
    reasons: dict[str, str] = field(default_factory=dict)
    """Replica id → why it was ranked where it was (filled by the router)."""

    def request(self, model_bytes: int) -> ReplicaRequest:
        return ReplicaRequest(self.model_id, model_bytes, self.prefix_key, self.exclude)


def _text(value: Any) -> str:
    """The text of a message's content: a string, or the text parts of a list."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(p.get("text", "") for p in value
                       if isinstance(p, dict) and isinstance(p.get("text", ""), str))
    return ""


def prompt_text(path: str, body: dict[str, Any]) -> str:
    """The prompt as text, in the order the model reads it ("" when there is none)."""
    if path == "/v1/chat/completions" or (path == "/v1/infer"
                                          and isinstance(body.get("input"), list)):
        messages = body.get("messages") if path == "/v1/chat/completions" else body["input"]
        if not isinstance(messages, list):
            return ""
        return "".join(f"{m.get('role', '')}\x1e{_text(m.get('content'))}\x1d"
                       for m in messages if isinstance(m, dict))
    value = body.get("prompt") if path == "/v1/completions" else body.get("input")
    if isinstance(value, list) and value and isinstance(value[0], str | list):
        value = value[0]  # a batch of prompts: the first one (sluice serves one per request)
    if isinstance(value, list):  # token ids
        return " ".join(str(t) for t in value)
    return value if isinstance(value, str) else ""


def route_hint(path: str, raw_body: bytes, *, default_model: str,
               prefix_chars: int) -> RouteHint:
    """The hint for one request: its model (the default model when the body names none)
    and, for a prompt of at least ``prefix_chars`` characters, its prefix key."""
    if path not in PROMPT_PATHS:
        return RouteHint(default_model)
    try:
        body = json.loads(raw_body) if raw_body else {}
    except (ValueError, UnicodeDecodeError):
        return RouteHint(default_model)
    if not isinstance(body, dict):
        return RouteHint(default_model)
    model = body.get("model")
    model_id = model if isinstance(model, str) and model else default_model
    if path == "/v1/embeddings":
        return RouteHint(model_id)
    key = prefix_fingerprint(model_id, prompt_text(path, body), prefix_chars)
    return RouteHint(model_id, key)
