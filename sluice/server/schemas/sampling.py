"""The sampling fields every completion-like body shares (OpenAI's names, llama-server's
and vLLM's extensions, sluice's controls), and the chat template options of a chat body."""

from __future__ import annotations

from typing import Any

from pydantic import AliasChoices, Field, StrictBool, field_validator

from sluice.config.sampling import (
    MinP,
    Penalty,
    PenaltyLastN,
    RepetitionPenalty,
    Temperature,
    TopK,
    TopP,
)
from sluice.server.schemas.base import (
    MAX_CHOICES,
    MAX_LOGIT_BIAS,
    DeadlineMs,
    Priority,
    Stop,
    _Body,
)


class StreamOptions(_Body):
    include_usage: StrictBool = False



class _Sampling(_Body):
    """Fields shared by chat and completions (OpenAI names, the llama-server and vLLM
    sampling extensions, and sluice's controls)."""

    model: str | None = Field(default=None, min_length=1, max_length=256)
    """The model; none: the server's default model (llama-server makes it optional)."""
    max_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    # Sampling controls: ``None`` (or left out) = the model's default
    # (``sluice.engine.sampling_defaults``: the GGUF's, the config's, llama-server's).
    temperature: Temperature | None = None
    top_p: TopP | None = None
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    stop: Stop | None = None
    seed: int | None = None
    """Any integer (reduced to 64 bits); without one, the request id seeds sampling."""
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[str, float] | None = Field(default=None, max_length=MAX_LOGIT_BIAS)
    """Token id (as a string key) → bias in [-100, 100]; -100 bans the token."""
    user: str | None = Field(default=None, max_length=256)
    # llama-server's and vLLM's sampling extensions
    repetition_penalty: RepetitionPenalty | None = Field(
        default=None, validation_alias=AliasChoices("repetition_penalty", "repeat_penalty"))
    penalty_last_n: PenaltyLastN | None = Field(
        default=None, validation_alias=AliasChoices("penalty_last_n", "repeat_last_n"))
    min_p: MinP | None = None
    top_k: TopK | None = None
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
