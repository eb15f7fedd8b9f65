"""Chat templates: Gemma's turn format (the packaged base model's fallback) and
llama.cpp's built-in renderer, which recognises common templates by name or text."""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from typing import Any

GEMMA_TEMPLATE = "gemma"
"""The template name that selects ``render_gemma``."""


def render_gemma(messages: Sequence[Mapping[str, str]]) -> str:
    """Gemma's turn format; system text is prepended to the next user turn, no BOS."""
    parts: list[str] = []
    system: list[str] = []
    for message in messages:
        role, content = message["role"], message["content"].strip()
        if role == "system":
            system.append(content)
            continue
        role = "model" if role == "assistant" else role
        if system and role != "model":
            content = "\n\n".join([*system, content])
            system = []
        parts.append(f"<start_of_turn>{role}\n{content}<end_of_turn>\n")
    if system:  # a conversation of system messages only
        parts.append(f"<start_of_turn>user\n{chr(10).join(system)}<end_of_turn>\n")
    parts.append("<start_of_turn>model\n")
    return "".join(parts)


def pick_template(lib: Any, model: Any, configured: str | None) -> str:
    """The configured template, else the GGUF's own, else ``gemma``."""
    if configured:
        return configured
    embedded = lib.llama_model_chat_template(model, None)
    return embedded.decode("utf-8", "replace") if embedded else GEMMA_TEMPLATE


def apply_template(lib: Any, template: str, messages: Sequence[Mapping[str, str]]) -> str:
    """The prompt text of ``messages`` under ``template``; ``ValueError`` if llama.cpp
    does not know the template."""
    if template == GEMMA_TEMPLATE:
        return render_gemma(messages)
    return render_builtin(lib, template, messages)


def render_builtin(lib: Any, template: str, messages: Sequence[Mapping[str, str]]) -> str:
    """llama.cpp's built-in renderer: it recognises common templates by name or text."""
    encoded = [(m["role"].encode(), m["content"].encode()) for m in messages]
    chat = (lib.llama_chat_message * len(encoded))()
    for i, (role, content) in enumerate(encoded):
        chat[i].role, chat[i].content = role, content
    name = template.encode()
    size = 256 + sum(len(r) + len(c) for r, c in encoded) * 2
    for _ in range(2):
        buf = ctypes.create_string_buffer(size)
        n = lib.llama_chat_apply_template(name, chat, len(encoded), True, buf, size)
        if n < 0:
            raise ValueError(f"chat template {template[:60]!r} is not supported")
        if n <= size:
            return buf.raw[:n].decode("utf-8", "replace")
        size = n
    raise ValueError("chat template output did not fit")  # pragma: no cover
