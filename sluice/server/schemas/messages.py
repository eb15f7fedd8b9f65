"""The parts of a conversation that chat-like bodies share: messages and their content,
tool definitions and the tool choice, and response formats (``json_object``,
``json_schema``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, StrictBool, field_validator, model_validator

from sluice.server.schemas.base import (
    MAX_TOOLS,
    FunctionName,
    _Body,
    check_json_schema,
)


class ContentPart(_Body):
    """A part of message content; only text parts are served (``text``, or the Responses
    API's ``input_text``)."""

    type: str = Field(max_length=64)
    text: str | None = None

    @model_validator(mode="after")
    def _text_only(self) -> ContentPart:
        if self.type not in ("text", "input_text") or self.text is None:
            raise ValueError(f"content parts must be text parts with a 'text'; got type "
                             f"{self.type[:64]!r}")
        return self


class FunctionCall(_Body):
    name: FunctionName
    arguments: str = Field(default="{}", max_length=1_000_000)


class ToolCallItem(_Body):
    """A tool call in an assistant message of the history."""

    id: str = Field(default="", max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = Field(default=None, max_length=256)
    tool_calls: list[ToolCallItem] | None = Field(default=None, max_length=MAX_TOOLS)
    """Assistant messages: the calls it made."""
    tool_call_id: str | None = Field(default=None, max_length=256)
    """Tool messages: the call this is the result of."""
    reasoning_content: str | None = Field(default=None, max_length=10_000_000)
    """Assistant messages: the turn's thinking, as sluice returns it (passed to the chat
    template, which may render it)."""
    reasoning: str | None = Field(default=None, max_length=10_000_000)
    """vLLM's name of ``reasoning_content`` (sluice returns both); ``reasoning_content``
    wins where both are set."""

    @model_validator(mode="after")
    def _shape(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs content")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        return self

    def text(self, separator: str = "") -> str:
        """The content as one string: its text parts joined by ``separator``."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return separator.join(p.text or "" for p in self.content)

    def as_dict(self) -> dict[str, Any]:
        """The message as chat templates take it (content joined into one string, past
        thinking as ``reasoning_content``)."""
        out: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.name:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.function.name, "arguments": c.function.arguments}}
                for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        thinking = self.reasoning_content or self.reasoning
        if thinking:
            out["reasoning_content"] = thinking
        return out


class FunctionDef(_Body):
    name: FunctionName
    description: str | None = Field(default=None, max_length=100_000)
    parameters: dict[str, Any] | None = None
    """A JSON schema of the arguments object (``check_json_schema``)."""
    strict: StrictBool | None = None

    @field_validator("parameters")
    @classmethod
    def _schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if v is None else check_json_schema(v, "parameters")

    def as_tool(self) -> dict[str, Any]:
        """The function as a tool that chat templates take (no unknown fields, no
        ``strict``)."""
        spec = {k: v for k, v in (("name", self.name), ("description", self.description),
                                  ("parameters", self.parameters)) if v is not None}
        return {"type": "function", "function": spec}


class ToolDef(_Body):
    type: Literal["function"]
    function: FunctionDef

    def as_dict(self) -> dict[str, Any]:
        """The tool as chat templates take it."""
        return self.function.as_tool()


class NamedFunction(_Body):
    name: FunctionName


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(_Body):
    name: str = Field(default="response", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(_Body):
    """``text``, ``json_object`` (any JSON object; llama-server also takes a ``schema``
    here) or ``json_schema`` (OpenAI structured output)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and (self.json_schema is None
                                           or self.json_schema.schema_ is None):
            raise ValueError("type 'json_schema' needs json_schema.schema")
        return self
