"""The TPOT margin under a jump in concurrency (session 22, issue 15): a plain ``sluice
serve`` (``bench.llm_slo.sluice_plain_cmd``), a warm-up request, 8 closed-loop clients for
``n / 4`` requests, then 32 clients for ``n`` requests (128 new tokens each), with
``/status.json`` polled every 2 s (sequences running, the engine's ``tpot_margin``).

It runs whatever ``sluice`` the working directory's PYTHONPATH gives, so two checkouts
compare back to back under one heavy hold, e.g. main against a branch's worktree::

    for wt in /tmp/base /work/wt/llm-slo; do (cd $wt && PYTHONPATH=$wt \\
        python /work/wt/llm-slo/bench/tpot_margin_closed.py 64); done

Prints each phase's tokens/s and TPOT p50 / p95, and writes the polls to
``$TMPDIR/tpot_margin_polls-<dir name>.json``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.llm_bench import MODEL, PROMPTS
from bench.llm_slo import MAX_TOKENS, sluice_plain_cmd
from bench.loadgen import Sample, closed_loop
from bench.servers import free_port, running

POLL_S = 2.0


def poll(base: str, stop: threading.Event, polls: list[dict[str, Any]]) -> None:
    t0 = time.monotonic()
    while not stop.wait(POLL_S):
        try:
            with urllib.request.urlopen(base + "/status.json", timeout=2) as resp:
                status = json.load(resp)
        except OSError as exc:
            polls.append({"t_s": time.monotonic() - t0, "error": str(exc)})
            continue
        for worker in status.get("workers", []):
            for m in worker.get("models", []):
                if m.get("step_cost"):
                    polls.append({"t_s": round(time.monotonic() - t0, 1),
                                  "running": m["running"], "waiting": m["waiting"],
                                  "tpot_margin": m.get("tpot_margin")})


def phase(name: str, samples: list[Sample], wall_s: float) -> None:
    tpot = sorted(s.tpot_s for s in samples if s.tpot_s)
    print(f"{name}: {sum(s.tokens for s in samples) / wall_s:.1f} tok/s, TPOT p50 "
          f"{tpot[len(tpot) // 2] * 1000:.0f} ms, p95 "
          f"{tpot[max(0, int(0.95 * len(tpot)) - 1)] * 1000:.0f} ms", flush=True)


def main(n: int) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    polls: list[dict[str, Any]] = []
    stop = threading.Event()
    with running(sluice_plain_cmd(port), base + "/ready"):
        asyncio.run(closed_loop(base, MODEL, PROMPTS, concurrency=1, n_requests=1,
                                max_tokens=8))  # warm-up, not measured
        poller = threading.Thread(target=poll, args=(base, stop, polls), daemon=True)
        poller.start()
        for clients, requests in ((8, n // 4), (32, n)):
            samples, wall_s = asyncio.run(closed_loop(
                base, MODEL, PROMPTS, concurrency=clients, n_requests=requests,
                max_tokens=MAX_TOKENS))
            phase(f"c={clients}", samples, wall_s)
        stop.set()
        poller.join()
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"tpot_margin_polls-{Path.cwd().name}.json"
    out.write_text(json.dumps(polls))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 64)
