"""Start and stop the servers under test: one at a time, on 127.0.0.1, ended by PID."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def thread_cpu_s(pid: int) -> dict[int, float]:
    """User + system CPU seconds so far of each live thread of process ``pid``, by thread id
    (the main thread's id is ``pid``)."""
    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that just ended
        out[int(task.name)] = (int(fields[11]) + int(fields[12])) / ticks
    return out


def process_schedstat(pid: int) -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one) summed over the threads of
    process ``pid``, from /proc/<pid>/task/*/schedstat. The second is what contention from
    other processes cost it."""
    run_ns = wait_ns = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            run, wait, _ = (task / "schedstat").read_text().split()
        except (FileNotFoundError, ValueError):
            continue  # a thread that just ended
        run_ns, wait_ns = run_ns + int(run), wait_ns + int(wait)
    return run_ns / 1e9, wait_ns / 1e9


def thread_wait_s(pid: int) -> dict[int, float]:
    """Seconds each live thread of process ``pid`` has been runnable but waiting for a CPU,
    by thread id, from /proc/<pid>/task/*/schedstat."""
    out: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            _, wait, _ = (task / "schedstat").read_text().split()
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue  # a thread that just ended
        out[int(task.name)] = int(wait) / 1e9
    return out


def thread_nice(tid: int) -> int:
    """The nice value of thread ``tid`` (Linux: nice is per thread), from /proc."""
    return os.getpriority(os.PRIO_PROCESS, tid)


@contextmanager
def niced(tid: int, nice: int | None) -> Iterator[None]:
    """Thread ``tid`` at ``nice`` for the block, then back to its value before (lowering
    it back needs CAP_SYS_NICE: the benches run as root). ``None``: unchanged."""
    if nice is None:
        yield
        return
    before = thread_nice(tid)
    os.setpriority(os.PRIO_PROCESS, tid, nice)
    try:
        yield
    finally:
        os.setpriority(os.PRIO_PROCESS, tid, before)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 180.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was ready")
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise TimeoutError(f"{url} not ready after {timeout_s} s")


@contextmanager
def running(cmd: Sequence[str], ready_url: str, log_path: Path | None = None,
            env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``cmd`` until the block ends; SIGTERM (then SIGKILL) by PID."""
    log = open(log_path or os.devnull, "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, **(env or {})})
    try:
        wait_ready(ready_url, proc)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


def sluice_cmd(config_toml: str, port: int) -> tuple[list[str], Path]:
    """The command line for ``sluice serve`` on a config given as TOML text."""
    path = Path(tempfile.mkdtemp(prefix="sluice-bench-")) / "config.toml"
    path.write_text(config_toml)
    return [sys.executable, "-m", "sluice.cli", "serve", "-c", str(path), "--port", str(port),
            "--log-level", "warning"], path
