"""Request bodies, validated by pydantic; a value out of bounds is a 400 naming the field.

Unknown fields are kept aside (``extra="allow"``) rather than refused: routes ignore them,
say so in the ``x-sluice-ignored-fields`` header (``ignored_fields``), and refuse them with
400 only when ``server.strict_fields`` is set, as OpenAI's peers do.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationInfo,
    field_validator,
    model_validator,
)

MAX_STOP = 4
MAX_STOP_CHARS = 256
"""The longest stop sequence (characters): the detokenizer holds back this much text."""
MAX_CHOICES = 16
"""The most choices (``n``) a request may ask for; a model also caps it at its sequence
slots (``n_seq_max``)."""
MAX_TOP_LOGPROBS = 20
MAX_LOGIT_BIAS = 1024
MAX_TOOLS = 128
Priority = Annotated[int, Field(ge=0, le=9)]
DeadlineMs = Annotated[float, Field(gt=0, le=86_400_000)]
FunctionName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]


def check_stop(v: str | list[str] | None) -> str | list[str] | None:
    """Stop sequences, on every surface that takes them: at most ``MAX_STOP``, each 1 to
    ``MAX_STOP_CHARS`` characters."""
    items = [v] if isinstance(v, str) else (v or [])
    if len(items) > MAX_STOP:
        raise ValueError(f"at most {MAX_STOP} stop sequences")
    if any(not s or len(s) > MAX_STOP_CHARS for s in items):
        raise ValueError(f"stop sequences must be 1 to {MAX_STOP_CHARS} characters")
    return v


MAX_SCHEMA_CHARS = 100_000
"""The longest tool schema (its JSON text)."""


def check_json_schema(schema: dict[str, Any], what: str) -> dict[str, Any]:
    """A tool's schema, on every surface that takes tools: at most ``MAX_SCHEMA_CHARS`` of
    JSON, and valid against JSON Schema draft 2020-12's metaschema, as OpenAI and Anthropic
    check it whether or not the tool is called (a schema that only fails once a call is
    forced would answer some requests and not others); ``ValueError`` naming ``what`` and
    the first fault."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    if len(json.dumps(schema)) > MAX_SCHEMA_CHARS:
        raise ValueError(f"{what} is too large (over {MAX_SCHEMA_CHARS} characters of JSON)")
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "the root"
        raise ValueError(f"{what} is not a valid JSON schema (draft 2020-12) at {where}: "
                         f"{exc.message[:200]}") from None
    except RecursionError:
        raise ValueError(f"{what} is nested too deep") from None
    return schema


def check_unique_names(names: list[str], what: str) -> None:
    """Tool names, on every surface that takes tools: no name twice (``what`` names them
    in the error)."""
    if len(set(names)) != len(names):
        raise ValueError(f"{what} must be unique")


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")

    @field_validator("*", mode="after")
    @classmethod
    def _encodable(cls, v: Any) -> Any:
        """JSON's ``\\ud800`` escapes decode to lone surrogates, which no tokenizer or
        response encoder can take: refuse them here, naming the field."""
        for s in ([v] if isinstance(v, str) else v if isinstance(v, list) else ()):
            if isinstance(s, str):
                try:
                    s.encode("utf-8")
                except UnicodeEncodeError:
                    raise ValueError("text must be valid Unicode (no lone surrogates)") from None
        return v


def ignored_fields(body: BaseModel, prefix: str = "") -> list[str]:
    """Paths of the unknown fields in ``body`` and its nested bodies, e.g.
    ``["frobnicate", "messages.0.mood"]``."""
    found = [f"{prefix}{k}" for k in (body.model_extra or {})]
    for name in type(body).model_fields:
        value = getattr(body, name)
        items = list(enumerate(value)) if isinstance(value, list) else [(None, value)]
        for i, item in items:
            if isinstance(item, BaseModel):
                path = f"{prefix}{name}." if i is None else f"{prefix}{name}.{i}."
                found.extend(ignored_fields(item, path))
    return found


class StreamOptions(_Body):
    include_usage: StrictBool = False


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


class ToolDef(_Body):
    type: Literal["function"]
    function: FunctionDef

    def as_dict(self) -> dict[str, Any]:
        """The tool as chat templates take it (no unknown fields, no ``strict``)."""
        fn = self.function
        spec = {k: v for k, v in (("name", fn.name), ("description", fn.description),
                                  ("parameters", fn.parameters)) if v is not None}
        return {"type": "function", "function": spec}


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


class _Sampling(_Body):
    """Fields shared by chat and completions (OpenAI names, the llama-server and vLLM
    sampling extensions, and sluice's controls)."""

    model: str | None = Field(default=None, min_length=1, max_length=256)
    """The model; none: the server's default model (llama-server makes it optional)."""
    max_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    # Sampling controls: ``None`` (or left out) = the model's default
    # (``sluice.engine.sampling_defaults``: the GGUF's, the config's, llama-server's).
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    """Any integer (reduced to 64 bits); without one, the request id seeds sampling."""
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = Field(default=None, max_length=MAX_LOGIT_BIAS)
    """Token id (as a string key) → bias in [-100, 100]; -100 bans the token."""
    user: str | None = Field(default=None, max_length=256)
    # llama-server's and vLLM's sampling extensions
    repetition_penalty: float | None = Field(
        default=None, gt=0.0, le=10.0,
        validation_alias=AliasChoices("repetition_penalty", "repeat_penalty"))
    """llama.cpp's repeat penalty (vLLM: ``repetition_penalty``); 1 is off."""
    penalty_last_n: int | None = Field(
        default=None, ge=-1, le=1_000_000,
        validation_alias=AliasChoices("penalty_last_n", "repeat_last_n"))
    """Recent tokens the penalties look at; -1 = the whole context, 0 = none."""
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0, le=100_000)
    """0 = no top-k cut."""
    grammar: str | None = Field(default=None, max_length=100_000)
    """llama-server's GBNF grammar the output must match."""
    json_schema: dict[str, Any] | None = None
    """llama-server's JSON schema the output must match (beside ``response_format``)."""
    # sluice extensions
    ignore_eos: StrictBool = False
    priority: Priority | None = None
    deadline_ms: DeadlineMs | None = None
    speculation: StrictBool | None = None
    """sluice: ``false`` keeps the engine from drafting tokens for this request (n-gram
    speculation, greedy requests only; the output is the same either way)."""

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> str | list[str] | None:
        return check_stop(v)

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (v or {}).items():
            if not key.isdigit() or len(key) > 9:
                raise ValueError(f"keys must be token ids; got {key[:20]!r}")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"biases must be in [-100, 100]; got {bias} for {key}")
        return v

    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def bias_pairs(self) -> tuple[tuple[int, float], ...]:
        return tuple(sorted((int(k), float(b)) for k, b in (self.logit_bias or {}).items()))


SamplingBody = _Sampling
"""The sampling fields every completion-like body shares (OpenAI chat and completions,
llama-server's ``/completion``)."""


class TemplateKwargs(_Body):
    """A chat body's ``chat_template_kwargs``."""

    chat_template_kwargs: dict[str, Any] | None = None
    """vLLM's and llama-server's template options: ``enable_thinking`` (true or false)
    turns thinking on or off, and is what the template sees (other keys are ignored)."""

    @field_validator("chat_template_kwargs")
    @classmethod
    def _thinking_switch(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None and not isinstance(v.get("enable_thinking", False), bool):
            raise ValueError("enable_thinking must be true or false")
        return v

    def enable_thinking(self) -> bool | None:
        value = (self.chat_template_kwargs or {}).get("enable_thinking")
        return value if isinstance(value, bool) else None


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
    input: str | list[str] = Field()
    encoding_format: Literal["float", "base64"] = "float"
    user: str | None = Field(default=None, max_length=256)
    priority: Priority | None = None
    deadline_ms: DeadlineMs | None = None

    @field_validator("input")
    @classmethod
    def _inputs(cls, v: str | list[str]) -> str | list[str]:
        items = [v] if isinstance(v, str) else v
        if not items or len(items) > 256:
            raise ValueError("input must hold 1 to 256 texts")
        if any(len(s) > 100_000 for s in items):
            raise ValueError("each input must be at most 100000 characters")
        return v


class InferRequest(_Body):
    """The native endpoint: one input for any model, with sluice's controls."""

    model: str = Field(min_length=1, max_length=256)
    input: str | list[ChatMessage]
    tenant_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    priority: Priority | None = None
    deadline_ms: DeadlineMs | None = None
    max_new_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    stream: StrictBool = False
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    """``None`` (or left out) = the model's default, as for the other sampling controls."""
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0, le=100_000)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    seed: int | None = None
    stop: list[str] | None = None
    """As chat's: at most ``MAX_STOP`` sequences of 1 to ``MAX_STOP_CHARS`` characters."""

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: list[str] | None) -> list[str] | None:
        check_stop(v)
        return v


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


class SlotActionRequest(_Body):
    """llama-server's ``POST /slots/{id}?action=...`` body."""

    filename: str | None = Field(default=None, max_length=255)
    """The file in ``server.slot_save_path`` (save, restore): a plain name, no folders
    (checked by ``sluice.server.slot_files``, after whether slot files are on at all)."""
    model: str | None = Field(default=None, min_length=1, max_length=256)
    """The generative model whose slot it is (default: the default model)."""


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
