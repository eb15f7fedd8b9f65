"""Fixtures for the tenant tests: one ``redis-server`` per session (started here, stopped by
PID), flushed before each test that asks for it, and the in-process server factory of
``tests/server``.

Without ``redis-server`` on PATH the Redis tests are skipped, unless
``SLUICE_REQUIRE_REDIS=1`` (``scripts/test.sh`` sets it after installing Redis), when they
fail.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.server.conftest import serve  # noqa: F401 - re-exported fixture
from tests.tenants.redisproc import RedisProcess, redis_binary


@pytest.fixture(scope="session")
def redis_process() -> Iterator[RedisProcess]:
    binary = redis_binary()
    if binary is None:
        if os.environ.get("SLUICE_REQUIRE_REDIS") == "1":
            pytest.fail("redis-server is not on PATH (scripts/test.sh installs it)")
        pytest.skip("redis-server is not installed")
    pytest.importorskip("redis")
    proc = RedisProcess(binary)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def redis(redis_process: RedisProcess) -> RedisProcess:
    """The session's Redis, running and empty."""
    redis_process.start()  # a test before may have stopped it
    with redis_process.client() as c:
        c.flushall()
    return redis_process
