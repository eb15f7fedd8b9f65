"""Noisy neighbour: does one tenant's flood take another tenant's latency?

One sluice server on a synthetic generative model (a deterministic cost model, so the
numbers measure the scheduler, not a model). Its capacity C (completed requests/s) is
measured first with a closed loop. Then, for each configuration, in one run:

- tenant A (weight 1) floods: Poisson arrivals at 3 × its fair share, i.e. 1.5 × C;
- tenant B (weight 1) sends steady traffic: Poisson at 0.25 × C (half its share), each
  request with the tenant's default deadline of 5 s;

for 20 s of arrivals, every request a streamed completion of 16 tokens. Configurations:
``fifo``; ``wfq``; and ``wfq`` with A's quota at its share (``requests_per_s`` = C/2). The
report gives B's TTFT (p50/p95 of completed requests) and completion rate (completed
before the deadline / sent), A's, and each tenant's share of served tokens, in
bench/results/noisy_neighbour.json and .png.

    python bench/noisy_neighbour.py            # about 2.5 minutes
    python bench/noisy_neighbour.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.lib.loadgen import Sample, closed_loop, open_loop, percentile
from bench.lib.servers import free_port, running, sluice_cmd

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = "synth-chat"
MAX_TOKENS = 16
DEADLINE_MS = 5000
PROMPTS = [f"tenant prompt number {i} with a few more words" for i in range(16)]
KEY_A, KEY_B = "key-tenant-a", "key-tenant-b"


def config_toml(scheduler: str, a_limits: str = "") -> str:
    """One worker, 4 sequences at once; a 16-token request holds a slot about 0.5 s."""
    return f"""
[server]
default_model = "{MODEL}"
drain_timeout_s = 2
open_metrics = true  # the bench reads /metrics without a key (tenant keys close it)

[scheduling]
scheduler = "{scheduler}"
queue_capacity = 4096

[workers]
count = 1
budget_bytes = 1_000_000_000
inbox_capacity = 2

[[models]]
id = "{MODEL}"
kind = "generative"
backend = "synthetic"
task = "generation"
memory_bytes = 100_000_000
load_cost_s = 0.1
options = {{ load_s = 0.01, n_seq_max = 4, n_ctx_per_seq = 256, step_fixed_s = 0.02, \
decode_per_seq_s = 0.002, prefill_per_token_s = 0.0005 }}

[[tenants]]
id = "A"
api_keys = ["{KEY_A}"]
weight = 1.0
{a_limits}

[[tenants]]
id = "B"
api_keys = ["{KEY_B}"]
weight = 1.0
default_deadline_ms = {DEADLINE_MS}
"""


def served_tokens(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "sluice_tokens_total":
                tenant = s.labels["tenant"]
                out[tenant] = out.get(tenant, 0.0) + s.value
    return out


def tenant_summary(samples: list[Sample], sent_at: float) -> dict[str, Any]:
    ok = [s for s in samples if s.ok]
    ttft = [s.ttft_s for s in ok if s.ttft_s is not None]
    statuses: dict[str, int] = {}
    for s in samples:
        statuses[str(s.status)] = statuses.get(str(s.status), 0) + 1
    return {
        "sent": len(samples),
        "completed": len(ok),
        "completion_rate": len(ok) / len(samples) if samples else None,
        "ttft_p50_s": percentile(ttft, 0.5),
        "ttft_p95_s": percentile(ttft, 0.95),
        "ttft_max_s": max(ttft) if ttft else None,
        "statuses": statuses,
        "timeline": [[round(s.start_s - sent_at, 3), None if s.ttft_s is None
                      else round(s.ttft_s, 4), s.status] for s in samples],
    }


async def flood(url: str, capacity: float, duration_s: float, seed: int) -> dict[str, Any]:
    rate_a, rate_b = 1.5 * capacity, 0.25 * capacity
    t0 = time.perf_counter()
    (a, _), (b, _) = await asyncio.gather(
        open_loop(url, MODEL, PROMPTS, rate_per_s=rate_a, n_requests=int(rate_a * duration_s),
                  max_tokens=MAX_TOKENS, seed=seed, headers={"authorization": f"Bearer {KEY_A}"},
                  timeout_s=120.0),
        open_loop(url, MODEL, PROMPTS, rate_per_s=rate_b, n_requests=int(rate_b * duration_s),
                  max_tokens=MAX_TOKENS, seed=seed + 1,
                  headers={"authorization": f"Bearer {KEY_B}"}, timeout_s=120.0),
    )
    tokens = served_tokens(url)
    total = sum(tokens.values()) or 1.0
    return {
        "rate_a_per_s": rate_a,
        "rate_b_per_s": rate_b,
        "A": tenant_summary(a, t0),
        "B": tenant_summary(b, t0),
        "served_tokens": tokens,
        "served_token_share": {k: v / total for k, v in tokens.items()},
    }


def run_server(toml: str, fn: Any) -> Any:
    port = free_port()
    cmd, _ = sluice_cmd(toml, port)
    url = f"http://127.0.0.1:{port}"
    with running(cmd, f"{url}/ready"):
        return fn(url)


def measure_capacity(n_requests: int) -> float:
    async def go(url: str) -> float:
        samples, wall = await closed_loop(url, MODEL, PROMPTS, concurrency=8,
                                          n_requests=n_requests, max_tokens=MAX_TOKENS,
                                          headers={"authorization": f"Bearer {KEY_A}"})
        return sum(s.ok for s in samples) / wall

    return float(run_server(config_toml("fifo"), lambda url: asyncio.run(go(url))))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--out", default="noisy_neighbour")
    parser.add_argument("--replot", action="store_true",
                        help="redraw the PNG from the JSON of an earlier run")
    args = parser.parse_args()
    if args.replot:
        saved = json.loads((RESULTS / f"{args.out}.json").read_text())
        plot(saved["runs"], saved["setup"]["capacity_per_s"], RESULTS / f"{args.out}.png")
        return 0
    duration = 4.0 if args.quick else args.duration
    capacity = measure_capacity(40 if args.quick else 120)
    print(f"capacity C = {capacity:.2f} requests/s", flush=True)
    a_quota = f"limits = {{ requests_per_s = {capacity / 2:.3f}, burst = 2 }}"
    configs = {"fifo": ("fifo", ""), "wfq": ("wfq", ""), "wfq+quota": ("wfq", a_quota)}
    runs: dict[str, Any] = {}
    for name, (scheduler, limits) in configs.items():
        runs[name] = run_server(config_toml(scheduler, limits),
                                lambda url: asyncio.run(flood(url, capacity, duration, seed=7)))
        b = runs[name]["B"]
        print(f"{name:10s} B: p95 TTFT {b['ttft_p95_s']}, completion {b['completion_rate']:.2f}"
              f"; token share {runs[name]['served_token_share']}", flush=True)
    result = {
        "benchmark": "noisy_neighbour",
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "setup": {"model": "synthetic: 4 sequences, 20 ms + 2 ms/seq per step",
                  "max_tokens": MAX_TOKENS, "duration_s": duration, "capacity_per_s": capacity,
                  "A": "Poisson at 1.5 C (3x its share), weight 1",
                  "B": f"Poisson at 0.25 C, weight 1, deadline {DEADLINE_MS} ms",
                  "wfq+quota": "A limited to C/2 requests/s, burst 2"},
        "runs": runs,
        "timeline": "per request: [sent at (s from the start), TTFT (s) or null, status]",
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(result, indent=2))
    plot(runs, capacity, RESULTS / f"{args.out}.png")
    print(json.dumps({k: {"B_ttft_p95_s": v["B"]["ttft_p95_s"],
                          "B_completion_rate": v["B"]["completion_rate"],
                          "A_completion_rate": v["A"]["completion_rate"]}
                      for k, v in runs.items()}, indent=2))
    return 0


def plot(runs: dict[str, Any], capacity: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"fifo": "tab:red", "wfq": "tab:blue", "wfq+quota": "tab:green"}
    fig, axes = plt.subplots(1, 3, figsize=(15, 5.2))
    ax = axes[0]
    for name, run in runs.items():
        points = [(t, ttft) for t, ttft, status in run["B"]["timeline"] if status == 200
                  and ttft is not None]
        failed = [t for t, _, status in run["B"]["timeline"] if status != 200]
        ax.plot([p[0] for p in points], [p[1] for p in points], ".", color=colors[name],
                label=f"{name}: completed")
        if failed:
            ax.plot(failed, [DEADLINE_MS / 1000] * len(failed), "x", color=colors[name],
                    label=f"{name}: missed the {DEADLINE_MS / 1000:g} s deadline "
                          f"({len(failed)}, drawn at it)")
    ax.set_xlabel("B request sent at (s)")
    ax.set_ylabel("B time to first token (s)")
    ax.set_yscale("log")
    ax.set_title("tenant B's TTFT while A floods")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    names = list(runs)
    ax = axes[1]
    ax.bar(names, [runs[n]["B"]["ttft_p95_s"] or 0 for n in names],
           color=[colors[n] for n in names])
    ax.set_ylabel("B p95 TTFT (s), completed requests")
    ax.set_title("B p95 TTFT")
    for i, n in enumerate(names):
        v = runs[n]["B"]["ttft_p95_s"] or 0
        ax.text(i, v, f"{v:.2f} s", ha="center", va="bottom")
    ax = axes[2]
    width = 0.38
    xs = range(len(names))
    ax.bar([x - width / 2 for x in xs], [runs[n]["B"]["completion_rate"] for n in names],
           width, label="B completed", color=[colors[n] for n in names])
    ax.bar([x + width / 2 for x in xs],
           [runs[n]["served_token_share"].get("B", 0.0) for n in names], width,
           label="B share of served tokens (B sent 1/7 of the requests)",
           color="lightgray", edgecolor="black")
    ax.set_xticks(list(xs), names)
    ax.set_ylim(0, 1.05)
    ax.set_title("B completion rate and token share")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1))
    fig.suptitle(f"Noisy neighbour: A at 1.5 C, B at 0.25 C (C = {capacity:.1f} req/s, "
                 f"synthetic model, {MAX_TOKENS} tokens per request)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
