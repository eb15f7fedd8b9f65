"""Screenshots of the server's two pages for the docs, each after real traffic.

    .venv/bin/python scripts/page_screenshots.py [--out docs/img] [--traffic-s 150]

- ``status.png``: ``/status`` of a server on the synthetic backend (``examples/synthetic.toml``'s
  models, two tenants, one with a request quota, a metrics key) after ``--traffic-s`` of
  chat completions and embeddings at a load that rises and falls, with bursts past the queue
  and past the quota, so every chart has something to show.
- ``chat.png``: ``/`` of a plain ``sluice serve`` (the packaged SmolLM2-135M-Instruct) after
  two questions typed into the page and answered there.

Needs chromium (scripts/test.sh installs it) and, for the chat page, the packaged model.
Run from the repository root; it drives the browser the page tests use
(``tests/server/browser.py``).
"""

from __future__ import annotations

import argparse
import math
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.server.browser import Browser
from tests.server.live import LiveServer, config_with, start_server, synth_chat, synth_embed

METRICS_KEY = "screenshot-metrics"
KEYS = {"team-a": "key-team-a", "team-b": "key-team-b"}
READY_TIMEOUT_S = 300.0
QUESTIONS = ("What is the capital of France? Answer in one sentence.",
             "Name three primary colours.")


def status_server() -> LiveServer:
    return start_server(config_with(
        models=[synth_chat(step_fixed_s=0.02, decode_per_seq_s=0.002, n_seq_max=6),
                {**synth_embed(), "keep_alive": "90s"}],
        scheduling={"queue_capacity": 4}, workers={"inbox_capacity": 2},
        tenants=[{"id": "team-a", "api_keys": [KEYS["team-a"]],
                  "limits": {"requests_per_s": 1.0, "burst": 3}},
                 {"id": "team-b", "api_keys": [KEYS["team-b"]]}],
        server={"metrics_key": METRICS_KEY, "default_model": "synth-chat"}))


def drive(live: LiveServer, seconds: float) -> None:
    """Closed-loop clients whose number follows a slow wave (1 to 7), team-a's clients
    past its quota, and a burst of 40 requests every 40 s past the queue."""
    stop = time.monotonic() + seconds
    started = time.monotonic()

    def wanted(i: int) -> bool:
        phase = (time.monotonic() - started) / seconds
        return i < 1 + 6 * (0.5 - 0.5 * math.cos(2 * math.pi * phase))

    def client(i: int, tenant: str) -> None:
        body = {"model": "synth-chat", "max_tokens": 24 + 8 * (i % 5),
                "messages": [{"role": "user", "content": f"request {i}"}]}
        with httpx.Client(base_url=live.url, timeout=60,
                          headers={"Authorization": f"Bearer {KEYS[tenant]}"}) as c:
            n = 0
            while time.monotonic() < stop:
                if tenant == "team-b" and not wanted(i):
                    time.sleep(0.5)
                    continue
                n += 1
                if n % 4 == 0:
                    c.post("/v1/embeddings", json={"model": "synth-a", "input": "text"})
                else:
                    c.post("/v1/chat/completions", json=body)
                if tenant == "team-a":
                    time.sleep(0.4)

    def bursts() -> None:
        with httpx.Client(base_url=live.url, timeout=60,
                          headers={"Authorization": f"Bearer {KEYS['team-b']}"}) as c:
            while time.monotonic() + 40 < stop:
                time.sleep(40)
                threads = [threading.Thread(target=c.post, args=("/v1/chat/completions",),
                                            kwargs={"json": {
                                                "model": "synth-chat", "max_tokens": 16,
                                                "messages": [{"role": "user", "content": "b"}]}})
                           for _ in range(40)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()

    threads = [threading.Thread(target=client, args=(i, "team-b")) for i in range(7)]
    threads += [threading.Thread(target=client, args=(i, "team-a")) for i in range(2)]
    threads.append(threading.Thread(target=bursts))
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def status_png(out: Path, traffic_s: float) -> None:
    live = status_server()
    try:
        drive(live, traffic_s)
        time.sleep(3)  # one more point after the last request
        with Browser(width=1280, height=1700) as browser:
            browser.goto(f"{live.url}/status#key={METRICS_KEY}")
            browser.wait_for("document.querySelectorAll('#chart-tokens path.line').length > 0")
            browser.screenshot(out / "status.png")
    finally:
        live.stop()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def chat_png(out: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "sluice.cli", "serve", "--port", str(port)])
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:  # the packaged model loads first (a minute on a busy host)
            try:
                if httpx.get(f"{url}/ready", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("sluice serve did not become ready")
            time.sleep(1)
        with Browser(width=1100, height=640) as browser:
            browser.goto(f"{url}/")
            browser.wait_for("document.querySelectorAll('#model option').length > 0")
            for n, question in enumerate(QUESTIONS, start=1):
                browser.type_into("#prompt", question)
                browser.click("#send")
                browser.wait_for(
                    f"document.querySelectorAll('.msg.assistant .meta').length === {n}", 120)
            browser.screenshot(out / "chat.png")
    finally:
        server.terminate()
        server.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/img"))
    parser.add_argument("--traffic-s", type=float, default=150.0)
    parser.add_argument("--only", choices=("status", "chat"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.only != "chat":
        status_png(args.out, args.traffic_s)
    if args.only != "status":
        chat_png(args.out)


if __name__ == "__main__":
    main()
