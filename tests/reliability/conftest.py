"""The server fixtures of tests/server (a real uvicorn server on an ephemeral port)."""

from tests.server.conftest import serve, serve_module

__all__ = ["serve", "serve_module"]
