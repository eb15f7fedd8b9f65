"""Fixtures that run the real app under a real uvicorn server on an ephemeral port.

``serve(config)`` starts a server around ``create_app(config)`` in a thread and returns a
``LiveServer``; every server started through it is stopped when the test (or module,
for ``serve_module``) ends. ``synthetic_server`` is one shared server on
``examples/synthetic.toml`` for the tests that do not mind each other's traffic.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import httpx
import pytest

from sluice.backends.base import Backend
from sluice.config import Config
from tests.server.live import LiveServer, start_server, synthetic_config


@pytest.fixture
def serve() -> Iterator[Callable[..., LiveServer]]:
    """A factory: ``serve(config, backends=None)`` starts a server stopped at the end of
    the test."""
    started: list[LiveServer] = []

    def factory(config: Config, backends: Mapping[str, Backend] | None = None) -> LiveServer:
        live = start_server(config, backends)
        started.append(live)
        return live

    yield factory
    for live in reversed(started):
        live.stop()


@pytest.fixture(scope="module")
def serve_module() -> Iterator[Callable[..., LiveServer]]:
    """Like ``serve``, but the servers live until the module's tests are done."""
    started: list[LiveServer] = []

    def factory(config: Config, backends: Mapping[str, Backend] | None = None) -> LiveServer:
        live = start_server(config, backends)
        started.append(live)
        return live

    yield factory
    for live in reversed(started):
        live.stop()


@pytest.fixture(scope="module")
def synthetic_server(serve_module: Callable[..., LiveServer]) -> LiveServer:
    """One server on ``examples/synthetic.toml``, shared by a module's tests."""
    return serve_module(synthetic_config())


@pytest.fixture
def client(synthetic_server: LiveServer) -> Iterator[httpx.Client]:
    with synthetic_server.client() as c:
        yield c
