"""OpenAI Responses request bodies (``POST /v1/responses``), stateless: validated by pydantic
as the other bodies are (a bad field is a 400 naming it; unknown fields ignored and named).
``previous_response_id``, ``conversation`` and ``background`` need a response store, which
sluice does not keep: they are refused with a 400 naming the field."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    Discriminator,
    Field,
    StrictBool,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

from sluice.config.sampling import Temperature, TopP
from sluice.server.schemas.base import (
    MAX_TOOLS,
    DeadlineMs,
    FunctionName,
    Priority,
    _Body,
    check_json_schema,
    check_unique_names,
)
from sluice.server.schemas.messages import FunctionDef, JsonSchemaFormat

MAX_TEXT_CHARS = 4_000_000
MAX_INPUT_ITEMS = 1024


class InputPart(_Body):
    """A content part of an input message: text (``input_text``, or ``output_text`` in an
    assistant turn of the history); images and files are accepted by the schema so the
    refusal can name them (a text-only model answers 400)."""

    type: Literal["input_text", "output_text", "text", "input_image", "input_file",
                  "refusal"]
    text: str | None = Field(default=None, max_length=MAX_TEXT_CHARS)
    refusal: str | None = None


class MessageItem(_Body):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputPart]
    id: str | None = None
    status: str | None = None


class FunctionCallItem(_Body):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1, max_length=256)
    name: FunctionName
    arguments: str = Field(default="{}", max_length=1_000_000)
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(_Body):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1, max_length=256)
    output: str | list[InputPart]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        if isinstance(self.output, str):
            return self.output
        return "".join(p.text or "" for p in self.output)


class ReasoningText(_Body):
    """A part of a reasoning item: its thinking (``reasoning_text``, in ``content``) or a
    summary of it (``summary_text``, in ``summary``)."""

    type: Literal["reasoning_text", "summary_text"]
    text: str = Field(max_length=MAX_TEXT_CHARS)


class ReasoningItem(_Body):
    """Earlier reasoning sent back by the client: its ``content`` texts are the next
    assistant turn's ``reasoning_content`` for the chat template (a summary is not the
    thinking, and ``encrypted_content`` cannot be read: neither reaches the template)."""

    type: Literal["reasoning"]
    id: str | None = None
    content: list[ReasoningText] | None = Field(default=None, max_length=MAX_INPUT_ITEMS)
    summary: list[ReasoningText] = Field(default_factory=list, max_length=MAX_INPUT_ITEMS)
    encrypted_content: str | None = None
    status: str | None = None

    def text(self) -> str:
        """The thinking: the ``content`` texts joined."""
        return "".join(p.text for p in self.content or [])


def _item_type(v: Any) -> str:
    return str(v.get("type", "message")) if isinstance(v, dict) else str(
        getattr(v, "type", "message"))


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_type),
]
"""An input item by its ``type`` (a message may leave it out)."""


class FunctionTool(FunctionDef):
    """A Responses function tool: chat's function fields at the tool's top level, and
    ``parameters`` must describe an object (the Responses API's rule)."""

    type: Literal["function"]

    @field_validator("parameters")
    @classmethod
    def _schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None and v.get("type", "object") != "object":
            raise ValueError("parameters must be a JSON schema with type 'object'")
        return None if v is None else check_json_schema(v, "parameters")


class NamedTool(_Body):
    type: Literal["function"]
    name: FunctionName


class TextFormat(_Body):
    """``text.format``: ``text``, ``json_object`` or ``json_schema`` (name, schema,
    strict, at this level as the Responses API has it)."""

    type: Literal["text", "json_object", "json_schema"]
    name: str = Field(default="response", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None
    description: str | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> TextFormat:
        if self.type == "json_schema" and self.schema_ is None:
            raise ValueError("format type 'json_schema' needs a schema")
        return self

    def as_json_schema(self) -> JsonSchemaFormat:
        return JsonSchemaFormat.model_validate({"name": self.name, "schema": self.schema_,
                                                "strict": self.strict})


class TextConfig(_Body):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class Reasoning(_Body):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesRequest(_Body):
    model: str | None = Field(default=None, min_length=1, max_length=256)
    """Left out: the default model (llama-server's ``model`` is optional)."""
    input: str | list[InputItem]
    """A user message's text (at most ``MAX_TEXT_CHARS``), or 1 to ``MAX_INPUT_ITEMS``
    items."""
    instructions: str | None = Field(default=None, max_length=MAX_TEXT_CHARS)
    max_output_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    temperature: Temperature | None = None
    """Left out: the model's default, as every sampling field on every surface."""
    top_p: TopP | None = None
    tools: list[FunctionTool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedTool | None = None
    parallel_tool_calls: StrictBool | None = None
    text: TextConfig | None = None
    reasoning: Reasoning | None = None
    stream: StrictBool = False
    store: StrictBool | None = None
    """Accepted; nothing is stored (the response says ``store: false``)."""
    metadata: dict[str, str] | None = None
    user: str | None = Field(default=None, max_length=256)
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    background: StrictBool | None = None
    seed: int | None = None
    # llama-server's extensions
    return_progress: StrictBool = False
    """A stream also carries ``response.in_progress`` events with ``prompt_progress`` while
    the prompt is computed."""
    timings_per_token: StrictBool = False
    """Every streamed text delta carries llama-server's ``timings``."""
    # sluice extensions
    thinking_budget_tokens: int | None = Field(default=None, ge=0, le=1_000_000)
    """Thinking tokens before the end tag is written for the model."""
    priority: Priority | None = None
    deadline_ms: DeadlineMs | None = None

    @field_validator("input")
    @classmethod
    def _not_empty(cls, v: str | list[Any]) -> str | list[Any]:
        if isinstance(v, list) and not v:
            raise ValueError("input must not be empty")
        if isinstance(v, list) and len(v) > MAX_INPUT_ITEMS:
            raise ValueError(f"input holds at most {MAX_INPUT_ITEMS} items")
        if isinstance(v, str) and len(v) > MAX_TEXT_CHARS:
            raise ValueError(f"input holds at most {MAX_TEXT_CHARS} characters of text")
        return v

    @field_validator("tools")
    @classmethod
    def _unique(cls, v: list[FunctionTool] | None) -> list[FunctionTool] | None:
        check_unique_names([t.name for t in v or []], "tool names")
        return v

    @field_validator("tool_choice")
    @classmethod
    def _needs_tools(cls, v: Any, info: ValidationInfo) -> Any:
        if v in (None, "none", "auto"):
            return v
        tools = info.data.get("tools") or []
        if not tools:
            raise ValueError("tool_choice needs tools")
        if isinstance(v, NamedTool) and v.name not in [t.name for t in tools]:
            raise ValueError(f"function {v.name!r} is not among the tools")
        return v
