"""Fixtures for the deploy/ checks: Debian's ``prometheus`` and ``promtool``.

Without them on PATH the Prometheus tests are skipped, unless
``SLUICE_REQUIRE_PROMETHEUS=1`` (``scripts/test.sh`` sets it after installing the
package), when they fail.
"""

from __future__ import annotations

import os

import pytest

from tests.deploy.promproc import binary
from tests.server.conftest import serve  # noqa: F401 - re-exported fixture


def _require(name: str) -> str:
    path = binary(name)
    if path is None:
        if os.environ.get("SLUICE_REQUIRE_PROMETHEUS") == "1":
            pytest.fail(f"{name} is not on PATH (scripts/test.sh installs Debian's prometheus)")
        pytest.skip(f"{name} is not installed")
    return path


@pytest.fixture(scope="session")
def promtool() -> str:
    return _require("promtool")


@pytest.fixture(scope="session")
def prometheus() -> str:
    return _require("prometheus")
