"""The bodies of sluice's own endpoints: ``/v1/infer`` (one input for any model) and
tokenization (``/tokenize``, ``/detokenize``, in llama-server's and vLLM's shapes)."""

from __future__ import annotations

from pydantic import Field, StrictBool, model_validator

from sluice.config.sampling import MinP, Temperature, TopK, TopP
from sluice.server.schemas.base import (
    MAX_TOOLS,
    DeadlineMs,
    Priority,
    StopList,
    _Body,
)
from sluice.server.schemas.messages import ChatMessage, ToolDef


class InferRequest(_Body):
    """The native endpoint: one input for any model, with sluice's controls."""

    model: str = Field(min_length=1, max_length=256)
    input: str | list[ChatMessage]
    tenant_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    priority: Priority | None = None
    deadline_ms: DeadlineMs | None = None
    max_new_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    stream: StrictBool = False
    temperature: Temperature | None = None
    """``None`` (or left out) = the model's default, as for the other sampling controls."""
    top_p: TopP | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    seed: int | None = None
    stop: StopList | None = None
    """As chat's: at most ``MAX_STOP`` sequences of 1 to ``MAX_STOP_CHARS`` characters."""


class TokenizeRequest(_Body):
    """``POST /tokenize`` in llama-server's shape (``content``) or vLLM's (``prompt``, or
    ``messages`` rendered with the chat template)."""

    model: str | None = Field(default=None, min_length=1, max_length=256)
    content: str | None = Field(default=None, max_length=1_000_000)
    prompt: str | None = Field(default=None, max_length=1_000_000)
    messages: list[ChatMessage] | None = Field(default=None, min_length=1, max_length=1024)
    tools: list[ToolDef] | None = Field(default=None, max_length=MAX_TOOLS)
    add_special: StrictBool | None = None
    """llama-server: add BOS (default false)."""
    add_special_tokens: StrictBool | None = None
    """vLLM: add BOS (default true for ``prompt``, false for ``messages``)."""
    parse_special: StrictBool = True
    with_pieces: StrictBool = False
    return_token_strs: StrictBool = False
    add_generation_prompt: StrictBool = True

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        given = [k for k in ("content", "prompt", "messages") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of content, prompt or messages")
        return self


class DetokenizeRequest(_Body):
    model: str | None = Field(default=None, min_length=1, max_length=256)
    tokens: list[int] = Field(max_length=1_000_000)
