"""Graceful drain: once draining, new requests get 503 ``draining`` (with Retry-After)
while in-flight ones finish; on SIGTERM, requests that cannot finish within the drain
timeout end with a terminal error (never a cut connection) and the process exits 0.
(tests/test_cli.py shows in-flight requests that do finish in time.)"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tests.procs import free_port, start_serve
from tests.server.live import LiveServer, assert_error, config_with, synth_chat


def test_draining_refuses_new_work_and_finishes_what_is_in_flight(
    serve: Callable[..., LiveServer],
) -> None:
    live = serve(config_with(models=[synth_chat("slow", step_fixed_s=0.02, load_s=0.0)],
                             workers={"count": 1}))
    lines: list[str] = []
    started = threading.Event()

    def stream() -> None:
        body = {"model": "slow", "prompt": "a b", "max_tokens": 40, "stream": True}
        with live.client() as c, c.stream("POST", "/v1/completions", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    lines.append(line[6:])
                    started.set()

    t = threading.Thread(target=stream)
    t.start()
    assert started.wait(10)
    live.runtime.begin_drain()
    with live.client() as c:
        for path, body in (("/v1/completions", {"model": "slow", "prompt": "x"}),
                           ("/v1/infer", {"model": "slow", "input": "x"})):
            r = c.post(path, json=body)
            assert_error(r, 503, code="draining", type="server_shutting_down")
            assert int(r.headers["retry-after"]) >= 1
        assert c.get("/ready").json() == {"status": "draining"}
        assert c.get("/health").status_code == 200
    t.join(20)
    assert lines[-1] == "[DONE]"
    finals = [json.loads(x) for x in lines[:-1]]
    assert finals[-1]["choices"][0]["finish_reason"] == "length"


DRAIN_TOML = """
[server]
drain_timeout_s = 1
[workers]
count = 1
[[models]]
id = "chat"
kind = "generative"
backend = "synthetic"
task = "generation"
memory_bytes = 1000
options = { step_fixed_s = 0.03, n_seq_max = 4, n_ctx_per_seq = 512, load_s = 0.0 }
"""



def test_sigterm_ends_requests_past_the_drain_timeout_with_an_error_and_exits_zero(
    tmp_path: Path,
) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(DRAIN_TOML)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start_serve(cfg, port)
    results: list[tuple[int, list[str], str | None]] = []
    try:
        first_token = threading.Barrier(4)

        def stream() -> None:
            # 400 tokens at 30 ms a step: 12 s, far past the 1 s drain timeout
            body = {"model": "chat", "prompt": "a b c", "max_tokens": 400, "stream": True}
            lines: list[str] = []
            error: str | None = None
            status = 0
            try:
                with httpx.Client(timeout=30) as http, \
                        http.stream("POST", f"{base}/v1/completions", json=body) as resp:
                    status = resp.status_code
                    for line in resp.iter_lines():
                        if line.startswith("data: "):
                            lines.append(line[6:])
                            if len(lines) == 1:
                                first_token.wait(timeout=10)
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"
            results.append((status, lines, error))

        threads = [threading.Thread(target=stream) for _ in range(3)]
        for t in threads:
            t.start()
        first_token.wait(timeout=10)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:  # a newcomer is refused: 503 draining, or the listener is already closed
            late = httpx.post(f"{base}/v1/completions", json={"model": "chat", "prompt": "x"},
                              timeout=5)
            assert late.status_code == 503 and late.json()["error"]["code"] == "draining"
        except httpx.TransportError:
            pass
        for t in threads:
            t.join(30)
        assert proc.wait(timeout=30) == 0
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        output = proc.stdout.read().decode(errors="replace")
        proc.stdout.close()
    assert took < 1 + 5, (took, output)  # the drain timeout (1 s), not a hang
    assert len(results) == 3
    for status, lines, error in results:
        assert error is None, (error, output)  # no cut connection
        assert status == 200
        assert lines[-1] == "[DONE]"
        last: dict[str, Any] = json.loads(lines[-2])
        assert last["error"]["code"] == "shutdown", last
        assert last["error"]["type"] == "server_shutting_down"
        tokens = [json.loads(x) for x in lines[:-2]]
        assert 0 < len(tokens) < 400
    assert "Traceback" not in output, output
