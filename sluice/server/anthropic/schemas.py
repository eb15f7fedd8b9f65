"""Anthropic Messages request bodies (``POST /v1/messages`` and its ``count_tokens``),
validated by pydantic as the OpenAI bodies are: a bad field is a 400 naming it, unknown
fields are ignored and named in ``x-sluice-ignored-fields``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, ValidationInfo, field_validator, model_validator

from sluice.config.sampling import Temperature, TopK, TopP
from sluice.server.schemas.base import (
    MAX_TOOLS,
    DeadlineMs,
    FunctionName,
    Priority,
    StopList,
    _Body,
    check_json_schema,
    check_unique_names,
)

MAX_TEXT_CHARS = 4_000_000
"""The longest text of one block (the body limit bounds the sum)."""


class TextBlock(_Body):
    type: Literal["text"]
    text: str = Field(max_length=MAX_TEXT_CHARS)


class MediaBlock(_Body):
    """An image or document block: accepted by the schema so the refusal can name it (a
    text-only model answers 400)."""

    type: Literal["image", "document"]
    source: dict[str, Any] | None = None


class ToolUseBlock(_Body):
    type: Literal["tool_use"]
    id: str = Field(min_length=1, max_length=256)
    name: FunctionName
    input: dict[str, Any] = Field(default_factory=dict)


class ToolResultBlock(_Body):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1, max_length=256)
    content: str | list[Annotated[TextBlock | MediaBlock, Field(discriminator="type")]] | None \
        = None
    is_error: StrictBool = False

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))


class ThinkingBlock(_Body):
    """Earlier thinking, sent back by the client: a ``thinking`` block's text is its turn's
    ``reasoning_content`` for the chat template; ``redacted_thinking`` (encrypted by
    Anthropic) is dropped."""

    type: Literal["thinking", "redacted_thinking"]
    thinking: str | None = Field(default=None, max_length=MAX_TEXT_CHARS)
    signature: str | None = None
    data: str | None = None


Block = Annotated[TextBlock | MediaBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock,
                  Field(discriminator="type")]


class Message(_Body):
    role: Literal["user", "assistant"]
    content: str | list[Block]

    @model_validator(mode="after")
    def _blocks_fit_role(self) -> Message:
        if isinstance(self.content, list):
            for block in self.content:
                if isinstance(block, ToolUseBlock) and self.role != "assistant":
                    raise ValueError("tool_use blocks belong in assistant messages")
                if isinstance(block, ToolResultBlock) and self.role != "user":
                    raise ValueError("tool_result blocks belong in user messages")
        return self


class Tool(_Body):
    name: FunctionName
    description: str | None = Field(default=None, max_length=100_000)
    input_schema: dict[str, Any]
    """A JSON schema of an object (``type: object``)."""
    type: Literal["custom"] | None = None

    @field_validator("input_schema")
    @classmethod
    def _object_schema(cls, v: dict[str, Any]) -> dict[str, Any]:
        if v.get("type") != "object":
            raise ValueError("input_schema must be a JSON schema with type 'object'")
        return check_json_schema(v, "input_schema")


class ToolChoice(_Body):
    type: Literal["auto", "any", "tool", "none"]
    name: FunctionName | None = None
    disable_parallel_tool_use: StrictBool | None = None

    @model_validator(mode="after")
    def _name_for_tool(self) -> ToolChoice:
        if self.type == "tool" and self.name is None:
            raise ValueError("tool_choice of type 'tool' needs a name")
        return self


class Metadata(_Body):
    user_id: str | None = Field(default=None, max_length=256)


class Thinking(_Body):
    """Extended thinking: ``enabled`` with a budget of thinking tokens, or ``disabled``."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(default=None, ge=1, le=1_000_000)


class OutputFormat(_Body):
    """Structured output: the answer is JSON valid against ``schema``."""

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Body):
    format: OutputFormat | None = None
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None


class CountTokensRequest(_Body):
    """What ``count_tokens`` counts: the prompt a Messages request would run."""

    model: str = Field(min_length=1, max_length=256)
    messages: list[Message] = Field(min_length=1, max_length=1024)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None

    @field_validator("tools")
    @classmethod
    def _unique_tools(cls, v: list[Tool] | None) -> list[Tool] | None:
        check_unique_names([t.name for t in v or []], "tool names")
        return v

    @field_validator("tool_choice")
    @classmethod
    def _choice_needs_tools(cls, v: ToolChoice | None,
                            info: ValidationInfo) -> ToolChoice | None:
        if v is None or v.type in ("auto", "none"):
            return v
        tools = info.data.get("tools") or []
        if not tools:
            raise ValueError(f"tool_choice {v.type!r} needs tools")
        if v.type == "tool" and v.name not in [t.name for t in tools]:
            raise ValueError(f"tool {v.name!r} is not among the tools")
        return v

    def system_text(self) -> str:
        if self.system is None or isinstance(self.system, str):
            return self.system or ""
        return "\n".join(b.text for b in self.system)


class MessagesRequest(CountTokensRequest):
    """``POST /v1/messages``: ``max_tokens`` is required, as Anthropic requires it."""

    max_tokens: int = Field(ge=1, le=1_000_000)
    stop_sequences: StopList | None = None
    stream: StrictBool = False
    temperature: Temperature | None = None
    """Left out: the model's default, as every sampling field on every surface."""
    top_p: TopP | None = None
    top_k: TopK | None = None
    metadata: Metadata | None = None
    output_config: OutputConfig | None = None
    # sluice extensions
    priority: Priority | None = None
    deadline_ms: DeadlineMs | None = None
