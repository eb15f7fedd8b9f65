"""What a request asks of a thinking model, in every API's terms, and what the core does
with it: the tags its output is split by, and the budget of thinking tokens the engine
holds it to (the end tag written for the model once it is spent)."""

from __future__ import annotations

from dataclasses import dataclass

from sluice.backends.base import ModelSpec, Tokenizer
from sluice.engine.request import ThinkingLimit


@dataclass(frozen=True)
class ThinkingTags:
    """How a model marks its thinking: ``start`` and ``end`` tags; ``opened`` when the
    prompt already opened the thinking (the template ends with the start tag), so the
    output starts inside it."""

    start: str = "<think>"
    end: str = "</think>"
    opened: bool = False


EFFORT_BUDGET_TOKENS: dict[str, int | None] = {
    "none": 0, "minimal": 64, "low": 256, "medium": 1024, "high": None, "xhigh": None,
    "max": None,
}
"""``reasoning_effort`` (OpenAI) or ``output_config.effort`` (Anthropic) as a thinking
budget: ``none`` turns thinking off, ``high`` and above leave the model's own budget."""


@dataclass(frozen=True)
class ThinkingAsk:
    """A request's wishes: ``enabled`` (``None``: the model's default) and a budget of
    thinking tokens (``None``: the model's default)."""

    enabled: bool | None = None
    budget_tokens: int | None = None

    @classmethod
    def of(cls, *, effort: str | None = None, enabled: bool | None = None,
           budget_tokens: int | None = None) -> ThinkingAsk:
        """From any API's fields: an explicit budget wins over the effort's; an effort of
        ``none`` (or ``enabled`` false) turns thinking off."""
        if effort is not None and budget_tokens is None:
            budget_tokens = EFFORT_BUDGET_TOKENS.get(effort)
            if effort == "none":
                enabled = False if enabled is None else enabled
        return cls(enabled, budget_tokens)


def opened_by(prompt_text: str | None, start: str, end: str, configured: bool) -> bool:
    """Whether the output starts inside the thinking: the rendered chat prompt ends with the
    start tag (a template that opens it, ``enable_thinking`` true), not with the end tag
    (one that wrote an empty thinking block, ``enable_thinking`` false); else (a prompt that
    ends otherwise, or no chat) the model's configured ``opened``."""
    tail = (prompt_text or "").rstrip()
    if tail.endswith(end):
        return False
    return True if tail.endswith(start) else configured


def thinking_plan(spec: ModelSpec, tok: Tokenizer, ask: ThinkingAsk | None, *,
                  constrained: bool, prompt_text: str | None = None,
                  ) -> tuple[ThinkingTags | None, ThinkingLimit | None]:
    """The tags to split by (``None``: the model does not think in tags) and the engine's
    budget (``None``: none). Thinking off is a budget of 0: the end tag comes at once.
    A constrained request (a forced tool call, a JSON schema) gets no budget: its grammar
    decides every token. ``prompt_text``: the rendered chat prompt (``opened_by``)."""
    fmt = spec.reasoning
    if fmt is None:
        return None, None
    opened = opened_by(prompt_text, fmt.start, fmt.end, fmt.opened)
    tags = ThinkingTags(fmt.start, fmt.end, opened)
    enabled = fmt.enabled if ask is None or ask.enabled is None else ask.enabled
    budget = 0 if not enabled else (
        ask.budget_tokens if ask is not None and ask.budget_tokens is not None
        else fmt.budget_tokens)
    if budget is None or constrained:
        return tags, None
    end_tokens = tuple(tok.tokenize(fmt.end + "\n\n", add_bos=False, special=True))
    return tags, ThinkingLimit(fmt.start, fmt.end, end_tokens, budget, opened)
