"""Fixtures for the planner tests: live servers (from tests/server) and, for the
real-model tests, the small ONNX variants built once per session by ``sluice prepare``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from sluice.cache import cache_path
from tests.server.conftest import serve, serve_module  # noqa: F401  (fixtures)

SMALL_LIMIT = 1500
"""Labelled snippets the test build uses (1200 train / 300 test): enough to order the
variants, quick on 2 cores."""


def small_cache_dir() -> Path:
    env = os.environ.get("SLUICE_TEST_CACHE")
    return Path(env) if env else cache_path(f"test-{SMALL_LIMIT}")


@pytest.fixture(scope="session")
def small_manifest() -> dict[str, Any]:
    """The small variants (no torch): built the first time (about a minute on 2 cores),
    read from the cache afterwards."""
    from sluice.prep import prepare

    return prepare(small_cache_dir(), limit=SMALL_LIMIT, threads=2, quiet=True)
