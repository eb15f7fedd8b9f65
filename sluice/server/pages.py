"""The HTML pages the server ships (``sluice/server/static/``, package data): the status
page (``/status``) and the chat page (``/``). Neither holds data: each page's script reads
the JSON APIs (``/status.json``; ``/v1/models`` and ``/v1/chat/completions``) with the key
the user gives it."""

from __future__ import annotations

import html
from importlib.resources import files

DEFAULT_MODEL_MARK = "__SLUICE_DEFAULT_MODEL__"
"""Where the chat page's file takes the default model's id."""


def static_text(name: str) -> str:
    """A file of ``sluice/server/static/``."""
    return files("sluice.server").joinpath("static", name).read_text(encoding="utf-8")


STATUS_PAGE = static_text("status.html")
CHAT_TEMPLATE = static_text("chat.html")


def chat_page(default_model: str) -> str:
    """The chat page, preselecting ``default_model`` in its model picker."""
    return CHAT_TEMPLATE.replace(DEFAULT_MODEL_MARK, html.escape(default_model, quote=True))
