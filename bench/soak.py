"""Soak: a bounded run at 80% of measured capacity with random client cancels, watching
the server process's resident memory, and reconciling every request.

The server is ``sluice serve`` on the synthetic backend (bench/overload.py's config) in
a subprocess; its RSS is read from ``/proc/<pid>/status`` every ``--sample-s`` seconds.
A tenth of the clients (``--cancel-fraction``) walk away 0.05–1 s after their first
token. Pass criteria (``checks`` in the JSON): zero transport failures; sent = ok +
rejected + expired + failed + cancelled; the server's ``sluice_requests_total`` accounts
for every request sent (a client cancel can race the last token, so the server may
count it completed: completed + cancelled on the server = ok + cancelled at the client);
the server holds nothing at the end; RSS at the end within 10% of RSS after warm-up.

    python bench/soak.py               # 10 minutes
    python bench/soak.py --duration 60                               # a short one

Writes bench/results/soak.json and soak.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.model_tables import SYNTH_CHAT, synthetic_toml
from bench.lib.outcomes import (
    closed,
    delta,
    per_second,
    poisson,
    rss_kib,
    server_counts,
    tally,
    wait_idle,
)
from bench.lib.prompts import SYNTH_PROMPTS
from bench.lib.servers import free_port, running, sluice_cmd

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = SYNTH_CHAT
MAX_TOKENS = 16


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=600.0, help="seconds")
    parser.add_argument("--load", type=float, default=0.8, help="fraction of capacity")
    parser.add_argument("--capacity-s", type=float, default=15.0)
    parser.add_argument("--cancel-fraction", type=float, default=0.1)
    parser.add_argument("--deadline-factor", type=float, default=6.0)
    parser.add_argument("--sample-s", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--out", default="soak")
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cmd, _ = sluice_cmd(synthetic_toml(queue=32, inbox=8), port)
    base = f"http://127.0.0.1:{port}"
    rss: list[tuple[float, int]] = []
    with running(cmd, f"{base}/ready", log_path=RESULTS / f"{args.out}.log") as proc:
        print(f"measuring capacity for {args.capacity_s} s", flush=True)
        cap = asyncio.run(closed(base, MODEL, SYNTH_PROMPTS, concurrency=8,
                                 duration_s=args.capacity_s, max_tokens=MAX_TOKENS))
        ok = [o for o in cap if o.kind == "ok"]
        capacity = len(ok) / max(o.start_s + o.latency_s for o in cap)
        deadline_ms = args.deadline_factor * statistics.median(o.latency_s for o in ok) * 1000
        wait_idle(base)
        before = server_counts(base, MODEL)
        stop = threading.Event()
        t_base = time.monotonic()

        def sample() -> None:
            while True:
                value = rss_kib(proc.pid)
                if value is not None:
                    rss.append((round(time.monotonic() - t_base, 1), value))
                if stop.wait(args.sample_s):
                    return

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        rate = args.load * capacity
        print(f"capacity {capacity:.2f} req/s; soaking at {rate:.2f} req/s for "
              f"{args.duration} s, deadline {deadline_ms:.0f} ms, "
              f"{args.cancel_fraction:.0%} cancelled by the client", flush=True)
        t0 = time.time()
        outcomes = asyncio.run(poisson(base, MODEL, SYNTH_PROMPTS, rate_per_s=rate,
                                       duration_s=args.duration, max_tokens=MAX_TOKENS,
                                       deadline_ms=deadline_ms, seed=args.seed,
                                       cancel_fraction=args.cancel_fraction))
        status = wait_idle(base)
        stop.set()
        sampler.join()
        server = delta(server_counts(base, MODEL), before)
        end_rss = rss_kib(proc.pid)
        if end_rss is not None:
            rss.append((round(time.monotonic() - t_base, 1), end_rss))
        kv = [m for w in status["workers"] for m in w["models"]]
        health = httpx.get(f"{base}/health", timeout=5).status_code
    counts = tally(outcomes)
    sent = len(outcomes)
    server_total = sum(server[s] for s in ("completed", "rejected", "expired", "failed",
                                           "cancelled"))
    warm = [v for t, v in rss if t >= min(30.0, args.duration / 4)] or [v for _, v in rss]
    start_rss, last_rss, max_rss = warm[0], rss[-1][1], max(v for _, v in rss)
    checks = {
        "zero_transport_failures": counts["transport"] == 0,
        "no_unexpected_status": counts["other"] == 0,
        "counts_add_up": sent == sum(counts[k] for k in ("ok", "rejected", "expired",
                                                          "failed", "cancelled")),
        "server_accounts_for_every_request": server_total == sent,
        "rejected_expired_failed_match": all(counts[k] == server[k] for k in
                                             ("rejected", "expired", "failed")),
        "completed_plus_cancelled_match": (server["completed"] + server["cancelled"]
                                           == counts["ok"] + counts["cancelled"]),
        "nothing_held_at_the_end": (status["live_requests"] == 0
                                    and all(m["kv_free_blocks"] == m["kv_total_blocks"]
                                            for m in kv if m["kv_total_blocks"])),
        "rss_flat_within_10_percent": last_rss <= start_rss * 1.10,
        "healthy_after": health == 200,
    }
    result = {
        "benchmark": "soak",
        "command": f"python bench/soak.py --duration {args.duration:g}",
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)),
        "machine": {"platform": platform.platform()},
        "duration_s": args.duration,
        "capacity_requests_per_s": round(capacity, 3),
        "offered_requests_per_s": round(rate, 3),
        "load_fraction": args.load,
        "cancel_fraction": args.cancel_fraction,
        "deadline_ms": round(deadline_ms),
        "sent": sent,
        "client": counts,
        "server": server,
        "cancels_that_raced_completion": server["completed"] - counts["ok"],
        "rss_kib": {"after_warmup": start_rss, "end": last_rss, "max": max_rss,
                    "growth_percent": round(100 * (last_rss - start_rss) / start_rss, 2)},
        "rss_series_kib": rss,
        "per_second": per_second([{"kind": o.kind, "start_s": o.start_s} for o in outcomes],
                                 int(args.duration) + 1),
        "health_after": health,
        "checks": checks,
        "passed": all(checks.values()),
    }
    (RESULTS / f"{args.out}.json").write_text(json.dumps(result, indent=1))
    plot(result, RESULTS / f"{args.out}.png")
    print(json.dumps({k: v for k, v in result.items()
                      if k not in ("rss_series_kib", "per_second")}, indent=2))
    return 0 if result["passed"] else 1


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(2, 1, figsize=(10, 7))
    t, v = zip(*result["rss_series_kib"], strict=True)
    a.plot(t, [x / 1024 for x in v], marker=".")
    a.set(title=f"sluice server RSS during a {result['duration_s']:g} s soak at "
                f"{result['load_fraction']:.0%} load ({result['sent']} requests, "
                f"{result['client']['cancelled']} cancelled by clients)",
          xlabel="s", ylabel="RSS (MiB)")
    a.set_ylim(0, max(v) / 1024 * 1.2)
    a.grid(alpha=0.3)
    window = 10
    for kind, series in sorted(result["per_second"].items()):
        binned = [sum(series[i:i + window]) / window for i in range(0, len(series), window)]
        b.plot([i * window for i in range(len(binned))], binned, label=kind)
    b.set(title="outcomes per second (10 s means), by arrival", xlabel="s",
          ylabel="requests/s")
    b.legend(fontsize=8)
    b.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    raise SystemExit(main())
