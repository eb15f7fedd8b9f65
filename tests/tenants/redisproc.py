"""A real ``redis-server`` for the tests: on a free loopback port, no persistence, started and
stopped by PID (never a system service). The fixture in ``conftest.py`` shares one per
session; a test may stop and restart it on the same port (the Redis-down test)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

START_TIMEOUT_S = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_binary() -> str | None:
    return shutil.which("redis-server")


class RedisProcess:
    """One ``redis-server --port N --save '' --appendonly no`` on 127.0.0.1."""

    def __init__(self, binary: str, port: int | None = None) -> None:
        self.binary = binary
        self.port = port or free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="sluice-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        if self.running:
            return
        log = open(self.dir / "redis.log", "ab")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.dir), "--daemonize", "no",
             "--protected-mode", "yes"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: "
                                   f"{(self.dir / 'redis.log').read_text()[-2000:]}")
            try:
                if self.client().ping():
                    return
            except Exception:
                if time.monotonic() > deadline:
                    self.stop()
                    raise
            time.sleep(0.02)

    def stop(self) -> None:
        """SIGTERM by PID, then SIGKILL if it lingers."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()

    def client(self) -> Any:
        """A synchronous redis-py client (decoded strings)."""
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True,
                           socket_timeout=2.0, socket_connect_timeout=2.0)
