"""The chat template of a GGUF: the configured one, else the GGUF's own
(``tokenizer.chat_template``), else none: a GGUF without a template (a base model) is a
completion model unless the operator names one. A configured value is a NAME when it is
one word of name characters (``chatml``, ``llama3`` ...: llama.cpp's built-in renderer;
``gemma``: Gemma's turn format; a word that names no built-in template is an error, not a
one-word template), and otherwise template TEXT, rendered as Jinja as llama-server does with
``--jinja`` (text without a single tag renders as itself). The names are the documented
fallbacks for a file whose own template is missing or cannot be rendered."""

from __future__ import annotations

import ctypes
import re
from collections.abc import Mapping, Sequence
from typing import Any

from sluice.backends.chat import (
    Capabilities,
    ChatTemplate,
    RenderOptions,
    gemma_template,
    jinja_template,
    looks_like_jinja,
)

GEMMA_TEMPLATE = "gemma"
"""The template name that selects Gemma's turn format."""


def builtin_template_names(lib: Any) -> frozenset[str]:
    """The template names llama.cpp's built-in renderer knows."""
    size = 256
    names = (ctypes.c_char_p * size)()
    count = min(int(lib.llama_chat_builtin_templates(names, size)), size)
    return frozenset(name.decode() for name in names[:count] if name)


def is_template_name(configured: str) -> bool:
    """Whether a configured template is a name (one word of name characters), else text."""
    return _NAME.fullmatch(configured) is not None


def check_configured_template(lib: Any, configured: str) -> None:
    """``ValueError`` (fit to print at start) unless ``configured`` is a built-in template
    name or Jinja text that compiles and renders a one-turn conversation."""
    known = builtin_template_names(lib)
    if is_template_name(configured):
        if configured != GEMMA_TEMPLATE and configured not in known:
            raise ValueError(f"{configured!r} is not a llama.cpp template name (known: "
                             f"{', '.join(sorted(known))}); template text is rendered as "
                             f"Jinja")
        return
    try:
        jinja_template(configured)
    except ValueError as exc:
        raise ValueError(f"the template text is not a usable Jinja template: {exc}") from None


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def pick_template(lib: Any, model: Any, vocab: Any,
                  configured: str | None) -> ChatTemplate | None:
    """The configured template, else the GGUF's own, else ``None`` (a completion model);
    ``ValueError`` if neither Jinja nor llama.cpp's built-in renderer can use it."""
    source = configured
    if not source:
        embedded = lib.llama_model_chat_template(model, None)
        if not embedded:
            return None
        source = embedded.decode("utf-8", "replace")
    if source == GEMMA_TEMPLATE:
        return gemma_template()
    if configured and is_template_name(configured):
        return builtin_template(lib, configured)
    if configured or looks_like_jinja(source):
        try:
            return jinja_template(source, bos_token=_token_text(lib, vocab, "bos"),
                                  eos_token=_token_text(lib, vocab, "eos"),
                                  adds_bos=bool(lib.llama_vocab_get_add_bos(vocab)))
        except ValueError as jinja_error:
            try:  # llama.cpp still recognises many templates by their text
                return builtin_template(lib, source)
            except ValueError:
                raise jinja_error from None
    return builtin_template(lib, source)


def _token_text(lib: Any, vocab: Any, which: str) -> str:
    token = getattr(lib, f"llama_vocab_{which}")(vocab)
    if token < 0:
        return ""
    text = lib.llama_vocab_get_text(vocab, token)
    return text.decode("utf-8", "replace") if text else ""


def builtin_template(lib: Any, template: str) -> ChatTemplate:
    """llama.cpp's built-in renderer (no tools: they use the generic format)."""

    def render(messages: Sequence[Mapping[str, Any]], _tools: Any,
               options: RenderOptions) -> str:
        return render_builtin(lib, template, messages, options.add_generation_prompt)

    render([{"role": "user", "content": "hi"}], None, RenderOptions())  # ValueError if unknown
    return ChatTemplate(template[:40], render, caps=Capabilities(system=True))


def render_builtin(lib: Any, template: str, messages: Sequence[Mapping[str, Any]],
                   add_generation_prompt: bool = True) -> str:
    """llama.cpp's built-in renderer: it recognises common templates by name or text."""
    encoded = [(str(m["role"]).encode(), str(m.get("content") or "").encode())
               for m in messages]
    chat = (lib.llama_chat_message * len(encoded))()
    for i, (role, content) in enumerate(encoded):
        chat[i].role, chat[i].content = role, content
    name = template.encode()
    size = 256 + sum(len(r) + len(c) for r, c in encoded) * 2
    for _ in range(2):
        buf = ctypes.create_string_buffer(size)
        n = lib.llama_chat_apply_template(name, chat, len(encoded), add_generation_prompt,
                                          buf, size)
        if n < 0:
            raise ValueError(f"chat template {template[:60]!r} is not supported")
        if n <= size:
            return buf.raw[:n].decode("utf-8", "replace")
        size = n
    raise ValueError("chat template output did not fit")  # pragma: no cover
