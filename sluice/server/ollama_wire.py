"""Ollama's wire format: request bodies, ``options`` mapped onto sluice's sampling fields,
and the response objects (``/api/chat``, ``/api/generate``, ``/api/tags``, ``/api/show``,
``/api/ps``, ``/api/embed``) as Ollama's API documentation gives them.

Where a request leaves a sampling option out, the model's default applies, as on every
other surface (``sluice.engine.sampling_defaults``); ``num_predict`` -1 or -2
(and no value) generate until a stop or the end of the sequence's context. ``num_ctx`` caps
prompt + generation within the model's sequence context (a larger value is the sequence's
context: sluice does not reload a model with another context). Options sluice has no use for
(``num_gpu``, ``num_thread``, ``mirostat``, ...) are ignored and named in the
``x-sluice-ignored-fields`` header.
"""

from __future__ import annotations

import hashlib
import json
import time
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from sluice.backends.base import ModelSpec
from sluice.config.sampling import (
    MinP,
    Penalty,
    PenaltyLastN,
    RepetitionPenalty,
    Temperature,
    TopK,
    TopP,
)
from sluice.engine.request import Constraint, Final
from sluice.policy.capacity.keep_alive import KeepAlive, parse_keep_alive
from sluice.server.errors import bad_param
from sluice.server.schemas.base import StopList
from sluice.server.schemas.messages import ToolDef

SAMPLING_NAMES = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
                  "min_p": "min_p", "repeat_penalty": "repetition_penalty",
                  "repeat_last_n": "penalty_last_n", "presence_penalty": "presence_penalty",
                  "frequency_penalty": "frequency_penalty"}
"""Ollama's option names for sluice's sampling fields."""
FOREVER_UNIX = 10_985_270_400.0
"""What Ollama reports as the expiry of a model that never unloads by time (the year 2318)."""


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow")


class Options(_Wire):
    """Ollama's ``options`` that sluice maps (the rest are ignored)."""

    num_predict: int | None = Field(default=None, ge=-2, le=1_000_000)
    num_ctx: int | None = Field(default=None, ge=1, le=10_000_000)
    temperature: Temperature | None = None
    top_k: TopK | None = None
    top_p: TopP | None = None
    min_p: MinP | None = None
    repeat_penalty: RepetitionPenalty | None = None
    repeat_last_n: PenaltyLastN | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    seed: int | None = None
    stop: StopList | None = None


class ToolCallFunction(_Wire):
    name: str = Field(min_length=1, max_length=256)
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolCall(_Wire):
    function: ToolCallFunction


class Message(_Wire):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = Field(default="", max_length=10_000_000)
    images: list[str] | None = None
    tool_calls: list[ToolCall] | None = Field(default=None, max_length=128)
    tool_name: str | None = Field(default=None, max_length=256)
    thinking: str | None = Field(default=None, max_length=10_000_000)
    """An assistant turn's thinking: the chat template's ``reasoning_content``."""


class _Generative(_Wire):
    model: str = Field(min_length=1, max_length=256)
    format: Literal["json"] | dict[str, Any] | None = None
    options: Options | None = None
    stream: StrictBool = True
    keep_alive: float | str | None = None
    think: StrictBool | Literal["high", "medium", "low"] | None = None


class ChatRequest(_Generative):
    messages: list[Message] = Field(default_factory=list, max_length=10_000)
    tools: list[ToolDef] | None = Field(default=None, max_length=128)


class GenerateRequest(_Generative):
    prompt: str = Field(default="", max_length=10_000_000)
    suffix: str | None = None
    system: str | None = Field(default=None, max_length=10_000_000)
    template: str | None = None
    images: list[str] | None = None
    raw: StrictBool = False
    context: list[int] | None = None


class EmbedRequest(_Wire):
    model: str = Field(min_length=1, max_length=256)
    input: str | list[str] = ""
    truncate: StrictBool = True
    options: Options | None = None
    keep_alive: float | str | None = None
    dimensions: int | None = None


class EmbeddingsRequest(_Wire):
    model: str = Field(min_length=1, max_length=256)
    prompt: str = ""
    options: Options | None = None
    keep_alive: float | str | None = None


class ModelRequest(_Wire):
    model: str = Field(default="", max_length=256)
    name: str = Field(default="", max_length=256)
    """The older field name of ``model``."""

    @property
    def id(self) -> str:
        return self.model or self.name


def ignored(body: BaseModel, prefix: str = "") -> list[str]:
    """Fields of ``body`` (and its ``options``) that sluice does not read."""
    names = [f"{prefix}{k}" for k in (body.model_extra or {})]
    options = getattr(body, "options", None)
    if isinstance(options, Options):
        names += [f"options.{k}" for k in (options.model_extra or {})]
    return names


def keep_alive_of(value: float | str | None) -> KeepAlive | None:
    """A request's ``keep_alive`` (400 naming the field when it is not one of Ollama's
    forms)."""
    if value is None:
        return None
    try:
        return parse_keep_alive(value)
    except ValueError as exc:
        raise bad_param("keep_alive", str(exc)) from None


def sampling(options: Options | None) -> dict[str, Any]:
    """``SamplingParams`` fields from ``options``: only those the client set (the model's
    defaults fill the rest, ``Runtime.sampling_params``)."""
    o = options or Options()
    sent = {ours: value for theirs, ours in SAMPLING_NAMES.items()
            if (value := getattr(o, theirs)) is not None}
    return {**sent, "seed": None if o.seed is None else o.seed % 2**64,
            "stop": tuple(o.stop or ())}


def format_constraint(fmt: Literal["json"] | dict[str, Any] | None) -> Constraint | None:
    """``format``: ``"json"`` or a JSON schema, as a decoding constraint."""
    if fmt is None:
        return None
    if fmt == "json":
        return Constraint("json_object")
    return Constraint("json_schema", spec=json.dumps(fmt))


def refuse_unsupported(body: _Generative, images: list[str] | None) -> None:
    """400 for what a text model cannot do: images, and thinking (no reasoning split)."""
    if images:
        raise bad_param("images", f"model '{body.model}' is a text model: it does not take "
                                  f"images")
    if body.think not in (None, False):
        raise bad_param("think", f"model '{body.model}' does not support thinking")


def openai_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Ollama messages as the chat templates take them (OpenAI shapes; ``thinking`` as
    ``reasoning_content``)."""
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        msg: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_calls:
            msg["tool_calls"] = [
                {"id": f"call_{i}_{j}", "type": "function",
                 "function": {"name": c.function.name,
                              "arguments": json.dumps(c.function.arguments)}}
                for j, c in enumerate(m.tool_calls)]
        if m.role == "tool" and m.tool_name:
            msg["name"] = m.tool_name
        if m.thinking:
            msg["reasoning_content"] = m.thinking
        out.append(msg)
    return out


def created_at(unix_s: float | None = None) -> str:
    """RFC 3339 in UTC with a ``Z``, as Ollama writes times."""
    moment = datetime.fromtimestamp(time.time() if unix_s is None else unix_s, UTC)
    return moment.isoformat().replace("+00:00", "Z")


def done_reason(final: Final) -> str:
    return "length" if final.finish_reason == "length" else "stop"


def durations(final_times: Any, prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """Ollama's counts and nanosecond durations from a request's timestamps."""
    t = final_times

    def ns(a: float | None, b: float | None) -> int:
        return 0 if a is None or b is None else max(0, int((b - a) * 1e9))

    return {"total_duration": ns(t.arrival_s, t.finished_s), "load_duration": 0,
            "prompt_eval_count": prompt_tokens,
            "prompt_eval_duration": ns(t.started_s, t.first_token_s),
            "eval_count": completion_tokens,
            "eval_duration": ns(t.first_token_s, t.finished_s)}


def digest(spec: ModelSpec) -> str:
    """A stable identifier of the configured model (its id, file and size), in Ollama's
    ``digest`` field; not the file's hash."""
    path = str(spec.options.get("path", ""))
    return hashlib.sha256(f"{spec.model_id}\0{path}\0{spec.memory_bytes}".encode()).hexdigest()


def details(spec: ModelSpec) -> dict[str, Any]:
    fmt = {"llamacpp": "gguf", "onnx": "onnx"}.get(spec.backend, spec.backend)
    return {"parent_model": "", "format": fmt, "family": "", "families": None,
            "parameter_size": "", "quantization_level": ""}


def model_entry(spec: ModelSpec, modified_unix: float) -> dict[str, Any]:
    """One model of ``/api/tags``."""
    return {"name": spec.model_id, "model": spec.model_id,
            "modified_at": created_at(modified_unix), "size": spec.memory_bytes,
            "digest": digest(spec), "details": details(spec)}


def capabilities(spec: ModelSpec) -> list[str]:
    if spec.kind == "generative":
        embeds = ["embedding"] if spec.embedding_model is not None else []
        return ["completion", "tools", *embeds]
    return ["embedding"] if spec.task == "embedding" else []
