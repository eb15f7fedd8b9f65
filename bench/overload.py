"""Overload: drive a sluice server at 2× its measured capacity for a bounded time, with a
deadline on every request, and prove nothing was lost.

For each system (the synthetic backend, and the real LLM: Gemma 3 270M through
llama.cpp), on 127.0.0.1, one at a time:

1. measure capacity: a closed loop at concurrency = sequence slots for ``--capacity-s``;
2. open loop, Poisson arrivals at ``--factor`` × capacity for ``--duration`` seconds,
   each with ``x-sluice-deadline-ms`` = ``--deadline-factor`` × the closed loop's median
   latency (or ``--deadline-ms``);
3. wait until the server holds nothing, then reconcile.

Pass criteria (all in the JSON's ``checks``): zero transport failures; every rejection is
429/503 with a Retry-After; no other status; every completed request met its deadline on
the server's clock (``sluice_goodput_total`` = completed); and the counts add up exactly:
sent = ok + rejected + expired + failed + cancelled, and each client count equals the
server's ``sluice_requests_total{state}`` for the run.

    python bench/overload.py                  # both, 60 s each
    python bench/overload.py --systems synthetic --duration 20 --capacity-s 8

Writes bench/results/overload_<system>.json and .png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.model_tables import (
    GEMMA,
    SYNTH_CHAT,
    llm_toml,
    synthetic_toml,
)
from bench.lib.outcomes import (
    Outcome,
    closed,
    delta,
    dump,
    per_second,
    poisson,
    rss_kib,
    server_counts,
    tally,
    wait_idle,
)
from bench.lib.prompts import LLM_PROMPTS, SYNTH_PROMPTS
from bench.lib.servers import free_port, running, sluice_cmd

RESULTS = Path(__file__).resolve().parent / "results"

SYSTEMS: dict[str, dict[str, Any]] = {
    "synthetic": {"toml": synthetic_toml, "model": SYNTH_CHAT, "prompts": SYNTH_PROMPTS,
                  "max_tokens": 16, "slots": 8},
    "llm": {"toml": llm_toml, "model": GEMMA, "prompts": LLM_PROMPTS,
            "max_tokens": 32, "slots": 8},
}


def reconcile(outcomes: list[Outcome], server: dict[str, int]) -> dict[str, Any]:
    """The checks, with the numbers that decide each."""
    counts = tally(outcomes)
    sent = len(outcomes)
    rejected = [o for o in outcomes if o.kind == "rejected"]
    ok = [o for o in outcomes if o.kind == "ok"]
    over = [o.latency_s - o.deadline_s for o in ok
            if o.deadline_s is not None and o.latency_s > o.deadline_s]
    checks = {
        "zero_transport_failures": counts["transport"] == 0,
        "no_unexpected_status": counts["other"] == 0,
        "every_rejection_429_or_503_with_retry_after": all(
            o.status in (429, 503) and o.retry_after is not None and int(o.retry_after) >= 1
            for o in rejected),
        "counts_add_up": sent == sum(counts[k] for k in
                                     ("ok", "rejected", "expired", "failed", "cancelled")),
        "client_equals_server": (counts["ok"] == server["completed"]
                                 and counts["rejected"] == server["rejected"]
                                 and counts["expired"] == server["expired"]
                                 and counts["failed"] == server["failed"]
                                 and counts["cancelled"] == server["cancelled"]),
        "completed_met_deadline_on_server_clock": server["goodput"] == server["completed"],
    }
    return {
        "sent": sent,
        "client": counts,
        "server": server,
        "rejection_statuses": sorted({o.status for o in rejected}),
        "rejection_codes": dict(sorted(_count(o.code for o in rejected).items())),
        "retry_after_values": dict(sorted(_count(o.retry_after for o in rejected).items())),
        "ok_over_deadline_client_clock": len(over),
        "ok_max_overshoot_ms_client_clock": round(max(over) * 1000, 1) if over else 0.0,
        "ok_latency_p50_s": _q([o.latency_s for o in ok], 0.5),
        "ok_latency_p99_s": _q([o.latency_s for o in ok], 0.99),
        "checks": checks,
        "passed": all(checks.values()),
    }


def _count(values: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[str(v)] = out.get(str(v), 0) + 1
    return out


def _q(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def run_system(name: str, args: argparse.Namespace) -> dict[str, Any]:
    spec = SYSTEMS[name]
    port = free_port()
    cmd, _ = sluice_cmd(spec["toml"](args.queue_capacity, args.inbox_capacity), port)
    base = f"http://127.0.0.1:{port}"
    model, prompts, max_tokens = spec["model"], spec["prompts"], spec["max_tokens"]
    log = RESULTS / f"overload_{name}.log"
    with running(cmd, f"{base}/ready", log_path=log) as proc:
        asyncio.run(closed(base, model, prompts, concurrency=2, duration_s=1.0,
                           max_tokens=4))  # warm-up
        print(f"[{name}] measuring capacity for {args.capacity_s} s", flush=True)
        cap = asyncio.run(closed(base, model, prompts, concurrency=spec["slots"],
                                 duration_s=args.capacity_s, max_tokens=max_tokens))
        wall = max(o.start_s + o.latency_s for o in cap)
        cap_ok = [o for o in cap if o.kind == "ok"]
        capacity = len(cap_ok) / wall
        median_s = statistics.median(o.latency_s for o in cap_ok)
        deadline_ms = args.deadline_ms or args.deadline_factor * median_s * 1000
        rate = args.rate or args.factor * capacity
        wait_idle(base)
        before = server_counts(base, model)
        rss_before = rss_kib(proc.pid)
        print(f"[{name}] capacity {capacity:.2f} req/s (median {median_s:.2f} s); offering "
              f"{rate:.2f} req/s for {args.duration} s, deadline {deadline_ms:.0f} ms",
              flush=True)
        t0 = time.time()
        outcomes = asyncio.run(poisson(base, model, prompts, rate_per_s=rate,
                                       duration_s=args.duration, max_tokens=max_tokens,
                                       deadline_ms=deadline_ms, seed=args.seed))
        drained = wait_idle(base)
        server = delta(server_counts(base, model), before)
        rss_after = rss_kib(proc.pid)
        health = httpx.get(f"{base}/health", timeout=5).status_code
    result = {
        "benchmark": "overload",
        "system": name,
        "model": model,
        "command": " ".join(["python", *sys.argv]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)),
        "machine": {"platform": platform.platform()},
        "max_tokens": max_tokens,
        "queue_capacity": args.queue_capacity,
        "inbox_capacity": args.inbox_capacity,
        "capacity_requests_per_s": round(capacity, 3),
        "capacity_median_latency_s": round(median_s, 3),
        "offered_requests_per_s": round(rate, 3),
        "load_factor": args.factor,
        "duration_s": args.duration,
        "deadline_ms": round(deadline_ms),
        "server_rss_kib": {"before": rss_before, "after": rss_after},
        "health_after": health,
        "idle_after": {"live_requests": drained["live_requests"],
                       "queue_depth": drained["queue_depth"]},
        **reconcile(outcomes, server),
        "outcomes": dump(outcomes),
    }
    print(f"[{name}] sent {result['sent']}: {result['client']}; server {server}; "
          f"passed={result['passed']} {result['checks']}", flush=True)
    return result


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"ok": "#16a34a", "rejected": "#f59e0b", "expired": "#dc2626",
              "failed": "#7c3aed", "cancelled": "#64748b", "transport": "#000000"}
    fig, axes = plt.subplots(2, len(results), figsize=(7 * len(results), 8), squeeze=False)
    for col, res in enumerate(results):
        outs = res["outcomes"]
        bins = int(res["duration_s"]) + 1
        ax = axes[0][col]
        bottom = [0] * bins
        for kind, color in colors.items():
            per_s = [0] * bins
            for o in outs:
                if o["kind"] == kind:
                    per_s[min(bins - 1, int(o["start_s"]))] += 1
            if any(per_s):
                ax.bar(range(bins), per_s, bottom=bottom, color=color, width=1.0,
                       label=f"{kind} ({sum(per_s)})")
                bottom = [b + p for b, p in zip(bottom, per_s, strict=True)]
        ax.axhline(res["capacity_requests_per_s"], color="k", ls="--", lw=1,
                   label=f"capacity {res['capacity_requests_per_s']:.1f}/s")
        ax.set(title=f"{res['system']}: {res['load_factor']}× capacity, outcome by arrival "
                     f"second", xlabel="arrival (s)", ylabel="requests")
        ax.legend(fontsize=8, loc="upper right")
        ax = axes[1][col]
        for kind in ("ok", "expired"):
            pts = [(o["start_s"], o["latency_s"]) for o in outs if o["kind"] == kind]
            if pts:
                ax.scatter(*zip(*pts, strict=True), s=6, color=colors[kind], label=kind)
        ax.axhline(res["deadline_ms"] / 1000, color="r", ls="--", lw=1,
                   label=f"deadline {res['deadline_ms']} ms")
        ax.set(title=f"{res['system']}: end-to-end latency of admitted requests",
               xlabel="arrival (s)", ylabel="latency (s)")
        ax.legend(fontsize=8, loc="upper right")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--systems", default="synthetic,llm")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of overload")
    parser.add_argument("--capacity-s", type=float, default=20.0)
    parser.add_argument("--factor", type=float, default=2.0)
    parser.add_argument("--deadline-factor", type=float, default=4.0,
                        help="deadline = this × the closed loop's median latency")
    parser.add_argument("--deadline-ms", type=float, default=None)
    parser.add_argument("--rate", type=float, default=None,
                        help="offered requests/s (default: --factor × measured capacity)")
    parser.add_argument("--queue-capacity", type=int, default=16)
    parser.add_argument("--inbox-capacity", type=int, default=8)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    results = []
    for name in args.systems.split(","):
        res = run_system(name, args)
        results.append(res)
        kept = {k: v for k, v in res.items() if k != "outcomes"}
        kept["per_second"] = per_second(res["outcomes"], int(res["duration_s"]) + 1)
        (RESULTS / f"overload_{name}.json").write_text(json.dumps(kept, indent=1))
    for res in results:
        plot([res], RESULTS / f"overload_{res['system']}.png")
    summary = {r["system"]: {k: r[k] for k in ("sent", "client", "server", "checks", "passed")}
               for r in results}
    print(json.dumps(summary, indent=2))
    return 0 if all(r["passed"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
