"""The TPOT margin under a jump in concurrency (session 22, issue 15): a plain ``sluice
serve`` (``bench.llm_slo.sluice_plain_cmd``), a warm-up request, 8 closed-loop clients for
``n / 4`` requests, then 32 clients for ``n`` requests (128 new tokens each), with
``/status.json`` polled every 2 s (sequences running, the engine's ``tpot_margin``).

It runs whatever ``sluice`` the working directory's PYTHONPATH gives, so two checkouts
compare back to back under one heavy hold, e.g. main against a branch's worktree::

    for wt in /tmp/base /work/wt/llm-slo; do (cd $wt && PYTHONPATH=$wt \\
        python /work/wt/llm-slo/bench/tpot_margin_closed.py 64); done

Prints each phase's tokens/s and TPOT p50 / p95 and, per phase, the engine's step table
(``/status.json`` ``step_times`` before and after the phase, by difference: mean cycle by
decodes, pure decode and beside a prompt) beside what the step-time model learned by the
phase's end predicts for a pure decode step of that many (the prior is read right after
the warm-up request, before the online fit takes over). Writes the polls and those
snapshots to ``$TMPDIR/tpot_margin_polls-<dir name>.json``.
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
from sluice.costs_cli import read_status, worker_models
from sluice.engine.step_times import from_json, minus, to_json
from sluice.policy.step_cost import StepCost

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


def model_entry(base: str) -> dict[str, Any]:
    """The generative model's entry on ``/status.json`` (the first worker's)."""
    for m in worker_models(read_status(base)):
        if m.get("step_cost"):
            return dict(m)
    raise RuntimeError("no generative model on /status.json")


def step_table(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The phase's steps by bucket (``minus`` of the two tallies) and what the model the
    engine holds at the end predicts for each pure-decode bucket."""
    window = minus(from_json(after.get("step_times") or {}),
                   from_json(before.get("step_times") or {}))
    cost = StepCost.from_json(after["step_cost"])
    rows = {}
    for bucket, b in sorted(window.items(), key=lambda kv: (int(kv[0].split("+")[0]), kv[0])):
        decodes = int(bucket.split("+")[0])
        row = {"steps": b.steps, "mean_ms": round(b.mean_s * 1000, 1),
               "mean_context": round(b.context_tokens / b.steps),
               "mean_prefill": round(b.prefill_tokens / b.steps, 1)}
        row["model_ms"] = round(cost.predict_s(decodes, round(row["mean_prefill"]),
                                               row["mean_context"]) * 1000, 1)
        rows[bucket] = row
    return {"step_cost": after["step_cost"], "tpot_margin": after.get("tpot_margin"),
            "window": to_json(window), "table": rows}


def print_table(name: str, table: dict[str, Any]) -> None:
    rows = table["table"]
    big = [k for k, r in rows.items() if r["steps"] >= 5]
    print(f"  {name} steps (>= 5 a bucket): " + "; ".join(
        f"{k}: {r['steps']}x {r['mean_ms']:.0f} ms (model {r['model_ms']:.0f}, ctx "
        f"{r['mean_context']})" for k, r in rows.items() if k in big), flush=True)


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
        before = model_entry(base)
        snapshots: dict[str, Any] = {"prior": before["step_cost"]}
        print(f"  prior: {before['step_cost']}", flush=True)
        poller = threading.Thread(target=poll, args=(base, stop, polls), daemon=True)
        poller.start()
        for clients, requests in ((8, n // 4), (32, n)):
            samples, wall_s = asyncio.run(closed_loop(
                base, MODEL, PROMPTS, concurrency=clients, n_requests=requests,
                max_tokens=MAX_TOKENS))
            phase(f"c={clients}", samples, wall_s)
            after = model_entry(base)
            snapshots[f"c={clients}"] = table = step_table(before, after)
            print_table(f"c={clients}", table)
            before = after
        stop.set()
        poller.join()
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"tpot_margin_polls-{Path.cwd().name}.json"
    out.write_text(json.dumps({"polls": polls, "phases": snapshots}))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 64)
