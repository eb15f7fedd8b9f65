"""The command line: ``sluice models``, ``sluice chat``, and ``sluice serve`` draining on
SIGTERM (in-flight requests finish, the process exits 0)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx

from tests.procs import free_port, start_serve

ROOT = Path(__file__).resolve().parent.parent
SLOW_CHAT = """
[server]
drain_timeout_s = 10
[workers]
count = 1
inbox_capacity = 8
[[models]]
id = "chat"
kind = "generative"
backend = "synthetic"
task = "generation"
memory_bytes = 1000
options = { step_fixed_s = 0.03, n_seq_max = 8, n_ctx_per_seq = 256, load_s = 0.0 }
"""


def sluice(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sluice.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def test_models_lists_the_configured_models() -> None:
    out = sluice("models", "-c", "examples/synthetic.toml")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert [ln.split("\t")[0] for ln in lines] == ["synth-a", "synth-b", "synth-chat"]
    assert "(default)" in lines[2]


def test_invalid_config_names_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(SLOW_CHAT.replace("inbox_capacity = 8", "inbox_capacity = 0"))
    out = sluice("models", "-c", str(bad))
    assert out.returncode == 2
    assert "workers.inbox_capacity" in out.stderr


def test_chat_streams_a_reply(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(SLOW_CHAT.replace("0.03", "0.001"))
    out = sluice("chat", "-c", str(cfg), "hello there", "--max-tokens", "5",
                 "--temperature", "0")
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.split()) == 5 and out.stdout.strip().startswith("w")



def test_sigterm_drains_in_flight_requests_and_exits_zero(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(SLOW_CHAT)
    port = free_port()
    proc = start_serve(cfg, port)
    base = f"http://127.0.0.1:{port}"
    try:
        results: list[tuple[int, list[str]]] = []
        first_token = threading.Barrier(5)

        def stream() -> None:
            body = {"model": "chat", "prompt": "a b c", "max_tokens": 40, "stream": True}
            lines: list[str] = []
            with httpx.Client(timeout=30) as http, \
                    http.stream("POST", f"{base}/v1/completions", json=body) as resp:
                waited = False
                for line in resp.iter_lines():
                    if line.startswith("data: "):
                        lines.append(line[6:])
                        if not waited:
                            waited = True
                            first_token.wait(timeout=10)
                results.append((resp.status_code, lines))

        threads = [threading.Thread(target=stream) for _ in range(4)]
        for t in threads:
            t.start()
        first_token.wait(timeout=10)
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(30)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
    assert len(results) == 4
    for status, lines in results:
        assert status == 200
        assert lines[-1] == "[DONE]"
        chunks = [json.loads(x) for x in lines[:-1]]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert sum(1 for c in chunks if c["choices"][0]["text"]) == 40
