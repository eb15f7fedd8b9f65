"""Request bodies, validated by pydantic. Unknown fields are refused (400 naming them),
so a client never silently gets behaviour it did not ask for."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_STOP = 4
Priority = Annotated[int, Field(ge=0, le=9)]
DeadlineMs = Annotated[float, Field(gt=0, le=86_400_000)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

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


class StreamOptions(_Body):
    include_usage: bool = False


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class _Sampling(_Body):
    """Fields shared by chat and completions (OpenAI names, plus sluice extensions)."""

    model: str = Field(min_length=1, max_length=256)
    max_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float = Field(default=0.0, ge=0.0, le=0.0)
    frequency_penalty: float = Field(default=0.0, ge=0.0, le=0.0)
    user: str | None = Field(default=None, max_length=256)
    # sluice extensions
    top_k: int = Field(default=0, ge=0, le=100_000)
    ignore_eos: bool = False
    priority: Priority | None = None
    deadline_ms: DeadlineMs | None = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> str | list[str] | None:
        items = [v] if isinstance(v, str) else (v or [])
        if len(items) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences")
        if any(not s or len(s) > 256 for s in items):
            raise ValueError("stop sequences must be 1 to 256 characters")
        return v

    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1, max_length=1024)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    logprobs: Literal[False] | None = None

    @field_validator("messages")
    @classmethod
    def _has_user_turn(cls, messages: list[ChatMessage]) -> list[ChatMessage]:
        if all(m.role in ("system", "developer") for m in messages):
            raise ValueError("messages must contain at least one user or assistant message")
        return messages


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int]
    echo: Literal[False] = False
    logprobs: None = None
    suffix: None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: str | list[str] | list[int]) -> str | list[str] | list[int]:
        if isinstance(v, list) and v and isinstance(v[0], str) and len(v) != 1:
            raise ValueError("exactly one prompt per request is supported")
        if isinstance(v, list) and not v:
            raise ValueError("prompt must not be empty")
        return v


class EmbeddingRequest(_Body):
    model: str = Field(min_length=1, max_length=256)
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
    stream: bool = False
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0, le=100_000)
    seed: int | None = None
    stop: list[str] | None = Field(default=None, max_length=MAX_STOP)


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
