"""Headless Chromium for the page tests: ``render`` (the DOM after a page's scripts ran, by
``--dump-dom``) and ``Browser`` (one page driven over the DevTools protocol, through the
``websockets`` client: navigate, evaluate, type, click with real input events, screenshot).
``SLUICE_REQUIRE_CHROMIUM`` turns a missing browser into a failure instead of a skip."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import ClientConnection, connect

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("SLUICE_REQUIRE_CHROMIUM"),
    reason="chromium is not installed (scripts/test.sh installs it from Debian's packages)")

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars")
START_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 30.0


def render(url: str) -> str:
    """The DOM after the page's scripts ran for a few (virtual) seconds."""
    assert CHROMIUM is not None, "chromium is not installed"
    with tempfile.TemporaryDirectory() as profile:
        out = subprocess.run(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=4000",
             "--dump-dom", url],
            capture_output=True, text=True, timeout=60, check=True)
    return out.stdout


class Browser:
    """One headless Chromium with one page, driven over the DevTools protocol."""

    def __init__(self, width: int = 1280, height: int = 900) -> None:
        assert CHROMIUM is not None, "chromium is not installed"
        self._profile = tempfile.mkdtemp(prefix="sluice-chromium-")
        self._proc = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={self._profile}",
             "--remote-debugging-port=0", f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._next_id = 0
        self._stack = contextlib.ExitStack()  # the connection is a context manager
        try:
            self._ws = self._connect()
            self.call("Page.enable")
            self.call("Runtime.enable")
            self.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                      deviceScaleFactor=1, mobile=False)
        except BaseException:
            self.close()
            raise

    def _connect(self) -> ClientConnection:
        port_file = Path(self._profile) / "DevToolsActivePort"
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
            if self._proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self._proc.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError("chromium did not open its DevTools port in time")
            time.sleep(0.05)
        port = int(port_file.read_text().splitlines()[0])
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
        page = next(t for t in targets if t["type"] == "page")
        return self._stack.enter_context(
            connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=10))

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command; its result (events that arrive meanwhile are dropped)."""
        self._next_id += 1
        self._ws.send(json.dumps({"id": self._next_id, "method": method, "params": params}))
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while True:
            message = json.loads(self._ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if message.get("id") == self._next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message["result"]
                return result

    def evaluate(self, expression: str) -> Any:
        """``expression``'s value in the page (promises awaited)."""
        out = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                        awaitPromise=True)
        if "exceptionDetails" in out:
            raise RuntimeError(f"{expression!r} raised: {out['exceptionDetails']}")
        return out["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 20.0) -> Any:
        """Poll ``expression`` until it is truthy; its value."""
        deadline = time.monotonic() + timeout_s
        value: Any = None
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"{expression!r} not true within {timeout_s} s (last: {value!r})")

    def goto(self, url: str) -> None:
        """Open ``url`` and wait until it has loaded."""
        self.call("Page.navigate", url=url)
        self.wait_for(f"location.href === {json.dumps(url)} && "
                      "document.readyState === 'complete'")

    def type_into(self, selector: str, text: str) -> None:
        """Focus the element and type ``text`` as keyboard input."""
        self.evaluate(f"document.querySelector({json.dumps(selector)}).focus()")
        self.call("Input.insertText", text=text)

    def click(self, selector: str) -> None:
        """A left click (press and release) at the element's centre."""
        x, y = self.evaluate(
            f"(() => {{const r = document.querySelector({json.dumps(selector)})"
            f".getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]}})()")
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left",
                      clickCount=1)

    def screenshot(self, path: Path) -> None:
        """The viewport as a PNG at ``path``."""
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        self._stack.close()
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=10)
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
