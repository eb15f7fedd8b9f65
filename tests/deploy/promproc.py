"""A real Prometheus for the tests (Debian's ``prometheus`` package, which brings
``promtool``): on a free loopback port, its data in a temporary folder, started and stopped
by PID."""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.procs import free_port

START_TIMEOUT_S = 20.0


def binary(name: str) -> str | None:
    """``prometheus`` or ``promtool`` on PATH."""
    return shutil.which(name)


class PrometheusProcess:
    """``prometheus --config.file=...`` on 127.0.0.1 with the given configuration."""

    def __init__(self, executable: str, config: dict[str, Any]) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="sluice-prometheus-"))
        self.port = free_port()
        self.config_path = self.dir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.executable = executable
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        path = self.dir / "prometheus.log"
        return path.read_text()[-4000:] if path.exists() else ""

    def start(self) -> None:
        with open(self.dir / "prometheus.log", "ab") as log:
            self.proc = subprocess.Popen(
                [self.executable, f"--config.file={self.config_path}",
                 f"--storage.tsdb.path={self.dir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}: "
                                   f"{self.log()}")
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"prometheus did not become ready: {self.log()}")
            time.sleep(0.1)

    def stop(self) -> None:
        """SIGTERM by PID, then SIGKILL if it lingers; remove its data."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's result (a vector's samples, or one scalar as a sample)."""
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10)
        body = r.json()
        if r.status_code != 200 or body.get("status") != "success":
            raise AssertionError(f"query failed: {promql}: {body.get('error', r.text)}")
        data = body["data"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def api(self, path: str) -> Any:
        r = httpx.get(f"{self.url}/api/v1/{path}", timeout=10)
        r.raise_for_status()
        return r.json()["data"]


def finite_values(samples: list[dict[str, Any]]) -> list[float]:
    """The samples' values that are numbers (a quantile over no observations is NaN)."""
    values = [float(s["value"][1]) for s in samples]
    return [v for v in values if math.isfinite(v)]
