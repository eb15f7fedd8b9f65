"""Gemma's turn format, the fallback for GGUFs without a chat template (the packaged
Gemma 3 270M base model's case)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def render_gemma(
    messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
) -> str:
    """Gemma's turn format; system text is prepended to the next user turn, no BOS. Roles
    other than system, user and assistant are an error (the caller polyfills tools)."""
    parts: list[str] = []
    system: list[str] = []
    for message in messages:
        role, content = message["role"], str(message.get("content") or "").strip()
        if role == "system":
            system.append(content)
            continue
        if role not in ("user", "assistant"):
            raise ValueError(f"the Gemma turn format has no {role!r} role")
        role = "model" if role == "assistant" else role
        if system and role != "model":
            content = "\n\n".join([*system, content])
            system = []
        parts.append(f"<start_of_turn>{role}\n{content}<end_of_turn>\n")
    if system:  # a conversation of system messages only
        parts.append(f"<start_of_turn>user\n{chr(10).join(system)}<end_of_turn>\n")
    if add_generation_prompt:
        parts.append("<start_of_turn>model\n")
    return "".join(parts)
