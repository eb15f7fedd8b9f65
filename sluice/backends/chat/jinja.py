"""Jinja chat templates (a GGUF's ``tokenizer.chat_template``, or one given in the config),
rendered as llama-server and transformers do: a sandboxed, immutable Jinja environment with
``trim_blocks``/``lstrip_blocks``, loop controls and transformers' ``{% generation %}`` block,
a ``tojson`` that keeps non-ASCII text and does not HTML-escape, ``raise_exception`` and
``strftime_now``; the variables ``messages``, ``tools``, ``add_generation_prompt``,
``enable_thinking``, ``bos_token`` and ``eos_token``, and the ones llama-server adds:
``date_string`` (today as ``%d %b %Y``, what the Llama 3.x templates print) and ``datetime``
(``%b %d %Y``), and ``functions``, the offered tools as JSON (``""`` for none), which
firefunction-v2's template writes into its system prompt."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from jinja2 import TemplateError, nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from sluice.backends.chat.template import RenderOptions

DATE_STRING_FORMAT = "%d %b %Y"
"""``date_string``: llama-server's, and the Llama 3.x templates' own default's form."""
DATETIME_FORMAT = "%b %d %Y"
"""``datetime``: llama-server's."""


def looks_like_jinja(text: str) -> bool:
    """Whether a configured ``chat_template`` is template text rather than a name."""
    return "{{" in text or "{%" in text


def _raise(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False, ensure_ascii: bool = False) -> str:
    return json.dumps(value, indent=indent, separators=separators, sort_keys=sort_keys,
                      ensure_ascii=ensure_ascii)


class GenerationBlock(Extension):
    """transformers' ``{% generation %} … {% endgeneration %}``: marks the assistant's own
    text for training masks; rendering it is rendering its body."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


class JinjaRenderer:
    """One compiled template. ``__call__`` raises ``ValueError`` with the template's own
    message (``raise_exception``) or Jinja's, never anything else. ``now`` gives the local
    time the date variables and ``strftime_now`` print."""

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "",
                 now: Callable[[], datetime] = datetime.now) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[loopcontrols, GenerationBlock])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except TemplateError as exc:
            raise ValueError(f"chat template does not compile: {exc}") from None
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._now = now

    def __call__(self, messages: Sequence[Mapping[str, Any]],
                 tools: Sequence[Mapping[str, Any]] | None,
                 options: RenderOptions | None = None) -> str:
        """``options.enable_thinking`` ``None`` leaves ``enable_thinking`` undefined."""
        options = options or RenderOptions()
        today = self._now()
        variables: dict[str, Any] = {
            "messages": list(messages), "tools": list(tools) if tools else None,
            "add_generation_prompt": options.add_generation_prompt,
            "bos_token": self.bos_token, "eos_token": self.eos_token,
            "date_string": today.strftime(DATE_STRING_FORMAT),
            "datetime": today.strftime(DATETIME_FORMAT),
            "functions": _tojson(list(tools), indent=2) if tools else "",
        }
        if options.enable_thinking is not None:
            variables["enable_thinking"] = options.enable_thinking
        try:
            return self._template.render(**variables)
        except TemplateError as exc:
            raise ValueError(f"chat template: {exc}") from None
        except (TypeError, KeyError, IndexError, AttributeError, ValueError) as exc:
            raise ValueError(f"chat template failed on these messages: {exc}") from None
