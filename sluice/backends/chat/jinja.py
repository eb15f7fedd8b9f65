"""Jinja chat templates (a GGUF's ``tokenizer.chat_template``, or one given in the config),
rendered as llama-server and transformers do: a sandboxed, immutable Jinja environment with
``trim_blocks``/``lstrip_blocks`` and loop controls, a ``tojson`` that keeps non-ASCII text
and does not HTML-escape, ``raise_exception`` and ``strftime_now``, and the variables
``messages``, ``tools``, ``add_generation_prompt``, ``bos_token`` and ``eos_token``."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def looks_like_jinja(text: str) -> bool:
    """Whether a configured ``chat_template`` is template text rather than a name."""
    return "{{" in text or "{%" in text


def _raise(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False, ensure_ascii: bool = False) -> str:
    return json.dumps(value, indent=indent, separators=separators, sort_keys=sort_keys,
                      ensure_ascii=ensure_ascii)


class JinjaRenderer:
    """One compiled template. ``__call__`` raises ``ValueError`` with the template's own
    message (``raise_exception``) or Jinja's, never anything else."""

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "") -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except TemplateError as exc:
            raise ValueError(f"chat template does not compile: {exc}") from None
        self.bos_token = bos_token
        self.eos_token = eos_token

    def __call__(self, messages: Sequence[Mapping[str, Any]],
                 tools: Sequence[Mapping[str, Any]] | None, add_generation_prompt: bool) -> str:
        try:
            return self._template.render(
                messages=list(messages), tools=list(tools) if tools else None,
                add_generation_prompt=add_generation_prompt, bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except TemplateError as exc:
            raise ValueError(f"chat template: {exc}") from None
        except (TypeError, KeyError, IndexError, AttributeError, ValueError) as exc:
            raise ValueError(f"chat template failed on these messages: {exc}") from None
