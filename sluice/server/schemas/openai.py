"""OpenAI's request bodies: chat completions, (text) completions and embeddings."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, StrictBool, StrictInt, StrictStr, ValidationInfo, field_validator

from sluice.server.schemas.base import (
    MAX_TOOLS,
    MAX_TOP_LOGPROBS,
    DeadlineMs,
    Priority,
    _Body,
    check_unique_names,
)
from sluice.server.schemas.embedding import EmbedValue, prompts
from sluice.server.schemas.messages import ChatMessage, NamedToolChoice, ResponseFormat, ToolDef
from sluice.server.schemas.sampling import TemplateKwargs, _Sampling


class ChatCompletionRequest(_Sampling, TemplateKwargs):
    messages: list[ChatMessage] = Field(min_length=1, max_length=1024)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    logprobs: StrictBool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    response_format: ResponseFormat | None = None
    tools: list[ToolDef] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    """For a model that thinks in tags: ``none`` turns thinking off; the others set its
    budget of thinking tokens (``core.reasoning.EFFORT_BUDGET_TOKENS``)."""
    thinking_budget_tokens: int | None = Field(default=None, ge=0, le=1_000_000)
    """sluice: thinking tokens before the end tag is written for the model."""
    verbose: StrictBool | None = None
    """llama-server's: the answer (not a stream) also carries ``__verbose.prompt``, the
    prompt as the model's chat template rendered it; unset: ``server.verbose_answers``
    (llama-server's ``--verbose``)."""
    continue_final_message: StrictBool | Literal["content", "reasoning_content"] | None = None
    """vLLM's (and llama-server's): continue the last message, an assistant turn, instead
    of closing it (``core.prefill``); unset: continued when the last message is an
    assistant's (llama-server's assistant prefill). llama-server's ``"content"`` is true;
    its ``"reasoning_content"`` (continue the turn's thinking) is refused (400)."""
    add_generation_prompt: StrictBool | None = None
    """vLLM's (and llama-server's): open the assistant's turn after the messages (false:
    the conversation rendered as it stands, unless a final assistant turn is continued);
    true with ``continue_final_message`` true is refused (400)."""
    return_progress: StrictBool = False
    """llama-server's: a stream also carries ``prompt_progress`` chunks while the prompt
    is computed (the engine reports each forward pass that feeds it)."""

    @field_validator("messages")
    @classmethod
    def _has_user_turn(cls, messages: list[ChatMessage]) -> list[ChatMessage]:
        if all(m.role in ("system", "developer") for m in messages):
            raise ValueError("messages must contain at least one user or assistant message")
        return messages

    @field_validator("top_logprobs")
    @classmethod
    def _needs_logprobs(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs: true")
        return v

    @field_validator("tool_choice")
    @classmethod
    def _needs_tools(cls, v: Any, info: ValidationInfo) -> Any:
        if v not in (None, "none", "auto") and not info.data.get("tools"):
            raise ValueError("tool_choice needs tools")
        if isinstance(v, NamedToolChoice):
            names = [t.function.name for t in info.data.get("tools") or []]
            if v.function.name not in names:
                raise ValueError(f"function {v.function.name!r} is not among the tools")
        return v

    @field_validator("tools")
    @classmethod
    def _tool_schemas(cls, v: list[ToolDef] | None) -> list[ToolDef] | None:
        check_unique_names([t.function.name for t in v or []], "tool function names")
        for t in v or []:
            if len(json.dumps(t.function.parameters or {})) > 100_000:
                raise ValueError(f"the parameters of {t.function.name!r} are too large")
        return v


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int]
    max_tokens: int | None = Field(default=16, ge=1, le=1_000_000)
    echo: StrictBool = False
    """Prepend the prompt to the text (with ``logprobs``: the prompt's logprobs too)."""
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    """Report each token's logprob with this many alternatives (OpenAI allows 5)."""
    suffix: None = None
    best_of: Literal[1] | None = None
    response_format: ResponseFormat | None = None
    """Constrain the text as on chat (vLLM and llama-server take it here too)."""

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: str | list[str] | list[int]) -> str | list[str] | list[int]:
        if isinstance(v, list) and v and isinstance(v[0], str) and len(v) != 1:
            raise ValueError("exactly one prompt per request is supported")
        if isinstance(v, list) and not v:
            raise ValueError("prompt must not be empty")
        return v


class EmbeddingRequest(_Body):
    model: str | None = Field(default=None, min_length=1, max_length=256)
    input: list[StrictStr | StrictInt | list[StrictStr | StrictInt]] | StrictStr = Field()
    """A text, a list of texts, token ids (``list[int]``, ``list[list[int]]``), or
    llama-server's mixed prompts of ids and texts (``schemas.embedding.prompts``)."""
    encoding_format: Literal["float", "base64"] = "float"
    user: str | None = Field(default=None, max_length=256)
    priority: Priority | None = None
    deadline_ms: DeadlineMs | None = None

    @field_validator("input")
    @classmethod
    def _inputs(cls, v: EmbedValue) -> EmbedValue:
        if isinstance(v, list) and any(isinstance(x, int) for x in v) and any(
                isinstance(x, list) for x in v):
            raise ValueError("a list holding token ids is one prompt: it cannot also hold "
                             "lists")
        items = prompts(v)
        if not items or len(items) > 256:
            raise ValueError("input must hold 1 to 256 prompts")
        if any(len(p) > 100_000 for p in items):
            raise ValueError("each input must be at most 100000 characters or token ids")
        if any(len(t) > 100_000 for p in items if isinstance(p, list)
               for t in p if isinstance(t, str)):
            raise ValueError("each input must be at most 100000 characters")
        return v
