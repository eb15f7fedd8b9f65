"""The live status page in a real browser: headless Chromium loads /status, its script
polls /status.json, and the rendered DOM shows the queue and every worker."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable

import pytest

from tests.server.live import LiveServer, synthetic_config

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("SLUICE_REQUIRE_CHROMIUM"),
    reason="chromium is not installed (scripts/test.sh installs it from Debian's packages)")


def render(url: str) -> str:
    """The DOM after the page's scripts ran for a few (virtual) seconds."""
    assert CHROMIUM is not None
    with tempfile.TemporaryDirectory() as profile:
        out = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", f"--user-data-dir={profile}", "--virtual-time-budget=4000",
             "--dump-dom", url],
            capture_output=True, text=True, timeout=60, check=True)
    return out.stdout


def test_status_page_renders_live_numbers(serve: Callable[..., LiveServer]) -> None:
    live = serve(synthetic_config())
    with live.client() as c:
        assert c.post("/v1/infer", json={"model": "synth-a", "input": "x"}).status_code == 200
    dom = render(f"{live.url}/status")
    sub = re.search(r'<div class="sub" id="sub">(.*?)</div>', dom)
    assert sub is not None, dom[:500]
    assert sub.group(1).startswith("scheduler fifo · router residency_aware · updated")
    rows = re.findall(r'<tr class="worker"><td>(\d+)</td>', dom)
    assert rows == ["0", "1"]  # one rendered row per configured worker
    assert "synth-a" in dom and "synth-chat" in dom  # resident models are listed
    assert '<b id="queue">0 / 32</b>' in dom
