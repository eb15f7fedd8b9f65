"""One pod's capacity, for the autoscaler's target (docs/operations.md, "Scale").

Serves the model exactly as deploy/k8s/configmap.yaml configures a pod (same model, worker,
slots and threads; tenants, Redis and gRPC left out), then closed loops of streaming
completions: at concurrency = the pod's slots (every request runs, none waits) and at twice
that (as many wait as run). From these:

- ``mu_per_s``: requests the pod completes per second when full (the service rate);
- ``ttft_full_p95_s``: time to first token with every slot busy and nothing waiting;
- ``wait_per_request_s``: how much each request waiting ahead adds to a new request's
  TTFT: by Little's law 1/mu; measured as (mean TTFT at 2× − mean TTFT at 1×) / (requests
  waiting at 2×); the larger of the two is used;

and the target number of waiting requests per pod that keeps TTFT p95 within the
objective: floor((SLO − ttft_full_p95_s) / wait_per_request_s).

The pod has its CPUs to itself (it requests them); a shared bench machine may not. So each
phase also records, over the server's threads, the time they ran and the time they were
runnable but waited for a CPU (/proc/<pid>/task/*/schedstat), and the numbers are given
twice: as measured, and as with the CPUs to itself, every time scaled by ``ran`` =
run / (run + wait), the fraction of its runnable time the server actually got (1.0 on an
idle machine). The target is computed from the dedicated figures. Writes
bench/results/capacity.json.

    python bench/capacity.py     # 3 to 15 minutes
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.loadgen import closed_loop, summarize
from bench.lib.prompts import PROMPTS
from bench.lib.servers import free_port, process_cpu_s, process_schedstat, running, sluice_cmd

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
CONFIGMAP = ROOT / "deploy" / "k8s" / "configmap.yaml"
DEPLOYMENT = ROOT / "deploy" / "k8s" / "deployment.yaml"
TTFT_SLO_S = 2.0
"""The p95 time-to-first-token objective (deploy/prometheus: sluice:slo:ttft_p95_seconds)."""


def pod_toml() -> tuple[str, dict[str, Any]]:
    """The pod's sluice.toml without what needs a cluster (tenants, Redis, gRPC port)."""
    [doc] = [d for d in yaml.safe_load_all(CONFIGMAP.read_text()) if d["kind"] == "ConfigMap"]
    config = tomllib.loads(doc["data"]["sluice.toml"])
    model = config["models"][0]
    lines = [
        "[server]", f'default_model = "{model["id"]}"',
        "[scheduling]", "queue_capacity = 512",
        "[workers]", f"count = {config['workers']['count']}",
        f"budget_bytes = {config['workers']['budget_bytes']}", "inbox_capacity = 256",
        "[[models]]", f'id = "{model["id"]}"', 'kind = "generative"', 'backend = "llamacpp"',
        'task = "generation"', f"memory_bytes = {model['memory_bytes']}",
        "options = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in model["options"].items())
        + " }",
    ]
    return "\n".join(lines) + "\n", model


def pod_cpus() -> float:
    """The CPUs the pod requests (deploy/k8s/deployment.yaml)."""
    [doc] = [d for d in yaml.safe_load_all(DEPLOYMENT.read_text()) if d["kind"] == "Deployment"]
    [container] = doc["spec"]["template"]["spec"]["containers"]
    return float(container["resources"]["requests"]["cpu"])


def hpa_target(mu_per_s: float, ttft_full_p95_s: float, measured_wait_s: float,
               slo_s: float = TTFT_SLO_S) -> tuple[float, float, int]:
    """(seconds each waiting request adds to TTFT, TTFT budget left for waiting, target
    waiting requests per pod). The added wait is the larger of Little's law (1/mu) and the
    measurement, so a noisy measurement never raises the target; at least 1."""
    wait_s = max(1.0 / mu_per_s, measured_wait_s)
    budget_s = slo_s - ttft_full_p95_s
    return wait_s, budget_s, max(1, math.floor(budget_s / wait_s))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-tokens", type=int, default=128,
                        help="tokens generated per request (EOS ignored)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="requests per client at each concurrency")
    parser.add_argument("--out", default=str(RESULTS / "capacity.json"))
    args = parser.parse_args()

    toml, model = pod_toml()
    cpus = pod_cpus()
    slots = int(model["options"]["n_seq_max"])
    port = free_port()
    cmd, _ = sluice_cmd(toml, port)
    base = f"http://127.0.0.1:{port}"
    phases: dict[str, dict[str, Any]] = {}
    with running(cmd, f"{base}/ready") as proc:
        # Warm-up: one request through the whole path.
        asyncio.run(closed_loop(base, model["id"], PROMPTS, concurrency=1, n_requests=1,
                                max_tokens=8))
        for label, concurrency in (("full", slots), ("double", 2 * slots)):
            load0, cpu0 = os.getloadavg()[0], process_cpu_s(proc.pid)
            run0, wait0 = process_schedstat(proc.pid)
            samples, wall = asyncio.run(closed_loop(
                base, model["id"], PROMPTS, concurrency=concurrency,
                n_requests=concurrency * args.rounds, max_tokens=args.max_tokens))
            row = summarize(samples, wall, ttft_slo_s=TTFT_SLO_S, tpot_slo_s=math.inf)
            ttfts = [x.ttft_s for x in samples if x.ok and x.ttft_s is not None]
            run1, wait1 = process_schedstat(proc.pid)
            ran = (run1 - run0) / ((run1 - run0) + (wait1 - wait0))
            row.update(concurrency=concurrency, ttft_mean_s=sum(ttfts) / len(ttfts),
                       ran=ran, cpu_per_wall=(process_cpu_s(proc.pid) - cpu0) / wall,
                       load_average=[load0, os.getloadavg()[0]])
            # As with the CPUs to itself: every time shrinks by the share it got.
            row["dedicated"] = {
                "requests_per_s": row["requests_per_s"] / ran,
                "tokens_per_s": row["tokens_per_s"] / ran,
                **{k: row[k] * ran for k in ("ttft_p50_s", "ttft_p95_s", "ttft_mean_s")},
            }
            phases[label] = row
            print(f"{label:6s} c={concurrency:2d}: {row['requests_per_s']:.3f} req/s "
                  f"{row['tokens_per_s']:.1f} tok/s  ttft p50 {row['ttft_p50_s']:.3f} s "
                  f"p95 {row['ttft_p95_s']:.3f} s  errors {row['errors']}  "
                  f"ran {ran:.2f} (load {load0:.1f})  dedicated: "
                  f"{row['dedicated']['tokens_per_s']:.1f} tok/s "
                  f"ttft p95 {row['dedicated']['ttft_p95_s']:.3f} s", flush=True)

    full, double = phases["full"]["dedicated"], phases["double"]["dedicated"]
    mu = full["requests_per_s"]
    waiting_at_double = phases["double"]["concurrency"] - slots
    measured_wait = (double["ttft_mean_s"] - full["ttft_mean_s"]) / waiting_at_double
    wait_per_request, budget, target = hpa_target(mu, full["ttft_p95_s"], measured_wait)
    result = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "python": platform.python_version()},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "model": model["id"],
        "pod": {"slots": slots, "n_threads": model["options"].get("n_threads"),
                "workers": 1, "cpus": cpus},
        "request": {"max_tokens": args.max_tokens, "prompts": "bench/llm_bench.py PROMPTS"},
        "ttft_slo_p95_s": TTFT_SLO_S,
        "phases": phases,
        "mu_per_s": mu,
        "one_over_mu_s": 1 / mu,
        "ttft_full_p95_s": full["ttft_p95_s"],
        "wait_per_request_measured_s": measured_wait,
        "wait_per_request_s": wait_per_request,
        "ttft_budget_for_waiting_s": budget,
        "target_waiting_per_pod": target,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"dedicated: mu = {mu:.3f} req/s; each waiting request adds {measured_wait:.3f} s "
          f"to TTFT (1/mu = {1 / mu:.3f} s); budget {budget:.3f} s → target {target} "
          f"waiting per pod")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
