"""The HTTP routes, one module per surface; ``common`` holds what they share."""

from __future__ import annotations

from fastapi import APIRouter

from sluice.server.routes import (
    admin,
    anthropic,
    llama_server,
    native,
    ollama,
    openai,
    operations,
    rerank,
    responses,
    tokens,
)

ROUTERS: tuple[APIRouter, ...] = (openai.router, responses.router, anthropic.router,
                                  native.router, tokens.router, rerank.router, ollama.router,
                                  llama_server.router, admin.router, operations.router)
"""Every router, in the order the app includes them."""

__all__ = ["ROUTERS"]
