"""A rendered conversation as template markup and plain user text.

Chat templates are text programs: they paste message content between their own turn
markers, and the result is tokenized. If that text were tokenized in one piece with
special-token parsing on, a user who types ``<start_of_turn>`` would forge a turn. So every
user-supplied string is wrapped in two Unicode noncharacters before rendering (``mark``),
whatever the template does with it (trim, concatenate, ``tojson``), and the rendered text is
split on them afterwards (``split_marked``): the template's own text is tokenized with
special tokens parsed, the user's as plain text (``chat_tokens``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

OPEN = "\ufdd0"
"""Opens user text; U+FDD0 is a noncharacter, reserved for a program's internal use."""
CLOSE = "\ufdd1"
"""Closes user text."""


def strip_markers(text: str) -> str:
    """``text`` without the marker characters (a client cannot send them through)."""
    return text.replace(OPEN, "").replace(CLOSE, "") if OPEN in text or CLOSE in text else text


def mark(text: str) -> str:
    """User text, wrapped so that it can be found again after rendering."""
    return OPEN + strip_markers(text) + CLOSE


def mark_json(value: Any) -> Any:
    """A JSON-like value with every string key and leaf marked (tool-call arguments)."""
    if isinstance(value, str):
        return mark(value)
    if isinstance(value, Mapping):
        return {mark(str(k)): mark_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [mark_json(v) for v in value]
    return value


def unmark(value: Any) -> Any:
    """Undo ``strip_markers``-free marking (for text shown back, e.g. a probe)."""
    if isinstance(value, str):
        return strip_markers(value)
    if isinstance(value, Mapping):
        return {unmark(k): unmark(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unmark(v) for v in value]
    return value


@dataclass(frozen=True, slots=True)
class ChatPart:
    """One run of the rendered prompt: template markup, or user text (``plain``)."""

    text: str
    plain: bool


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    """A rendered conversation, ready to tokenize: BOS is added by the tokenizer (a BOS the
    template writes as text has been taken off), markup parts may hold special tokens, plain
    parts never do."""

    parts: tuple[ChatPart, ...]

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.parts)


def split_marked(rendered: str, bos_text: str = "") -> ChatPrompt:
    """Split a rendering of marked messages into markup and plain parts. A leading
    ``bos_text`` (the template's ``{{ bos_token }}``) is dropped, as llama-server does,
    since the tokenizer adds BOS itself. ``ValueError`` if the markers do not pair up (a
    template that cut user text apart)."""
    parts: list[ChatPart] = []
    pos, plain = 0, False
    while pos <= len(rendered):
        want, other = (CLOSE, OPEN) if plain else (OPEN, CLOSE)
        end = rendered.find(want, pos)
        stray = rendered.find(other, pos)
        if stray != -1 and (end == -1 or stray < end):
            raise ValueError("the chat template split a message's text apart")
        if end == -1:
            if plain:
                raise ValueError("the chat template split a message's text apart")
            end = len(rendered)
        text = rendered[pos:end]
        if text:
            if parts and parts[-1].plain == plain:
                parts[-1] = ChatPart(parts[-1].text + text, plain)
            else:
                parts.append(ChatPart(text, plain))
        pos, plain = end + 1, not plain
    if bos_text and parts and not parts[0].plain and parts[0].text.startswith(bos_text):
        rest = parts[0].text[len(bos_text):]
        parts[0:1] = [ChatPart(rest, False)] if rest else []
    return ChatPrompt(tuple(parts))


class _Tokenize(Protocol):
    def tokenize(self, text: str, *, add_bos: bool, special: bool = True) -> list[int]: ...


def chat_tokens(tok: _Tokenize, prompt: ChatPrompt) -> list[int]:
    """BOS, then each part tokenized on its own: markup with special tokens parsed, user text
    as plain text, so no user text can become a control token."""
    tokens = tok.tokenize("", add_bos=True, special=False)
    for part in prompt.parts:
        tokens.extend(tok.tokenize(part.text, add_bos=False, special=not part.plain))
    return tokens
