"""Real ``sluice serve`` processes for the tests that need signals and exit codes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A loopback port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_serve(config: Path | None, port: int, timeout_s: float = 30.0,
                extra_args: tuple[str, ...] = ("--log-level", "warning"),
                cwd: Path = ROOT, env: Mapping[str, str] | None = None,
                ) -> subprocess.Popen[bytes]:
    """``sluice serve [-c config] --port port [extra_args]`` in the folder ``cwd`` with the
    environment ``env`` (default: this process's), returned once ``/ready`` answers 200.
    The caller ends it (by PID) and closes its stdout."""
    conf = ("-c", str(config)) if config is not None else ()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sluice.cli", "serve", *conf, "--port", str(port),
         *extra_args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env={**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"})
    end = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if time.monotonic() >= end or proc.poll() is not None:
            proc.kill()
            proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()
            raise AssertionError("sluice serve did not become ready")
        time.sleep(0.1)
