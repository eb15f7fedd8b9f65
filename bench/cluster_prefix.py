"""Prefix-aware vs round-robin routing across sluice replicas on Ray Serve, on the real model.

Workload: a shared-system-prompt service — ``--apps`` applications, each with its own long
system prompt (~``--system-words`` words), each request one of them (seeded) plus a short
question, streamed from ``/v1/completions`` with ``--max-tokens`` new tokens; open-loop
Poisson arrivals at ``--rate`` requests/s, the same arrival times and prompts for every
router. Two replicas on a local Ray (one llama.cpp thread each: the two cores of this
machine), the packaged Gemma 3 270M.

sluice's engine reuses the KV of a prompt prefix that a sequence running on the same
replica has fed, or that an idle slot there retained from an ended sequence
(``engine.prefix_reuse``, ``engine.retain_prefixes``; ``--no-retain`` turns retention off).
Round robin spreads each application's requests over both replicas; the ``affinity`` router
sends a system prompt to its home replica (consistent hashing on the prompt's first
characters, with a load bound), so with more system prompts than a replica has slots to
retain them in, a request finds its prefix at home and skips most of its prefill.
Routers run interleaved (``--repeats`` rounds of each), in one process, side by
side. Reports TTFT p50/p95, end-to-end p50, tokens/s and the ratios; JSON + PNG.

Run it alone on the host: it takes both cores for a few minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.lib.loadgen import open_loop, percentile, summarize  # noqa: E402
from bench.lib.prompts import QUESTIONS, system_prompt  # noqa: E402
from bench.lib.servers import free_port  # noqa: E402

MODEL = "gemma-3-270m"
def prompts(apps: int, words: int, n: int, seed: int) -> tuple[list[str], list[int]]:
    rng = random.Random(seed)
    systems = [system_prompt(a, words) for a in range(apps)]
    picks = [rng.randrange(apps) for _ in range(n)]
    return [systems[a] + rng.choice(QUESTIONS) + "\nAnswer:" for a in picks], picks


def config_data(router: str, args: argparse.Namespace, port: int) -> dict[str, Any]:
    n_ctx = args.slots * args.ctx_per_seq
    return {
        "server": {"host": "127.0.0.1", "port": port, "default_model": MODEL,
                   "drain_timeout_s": 30.0},
        "scheduling": {"queue_capacity": 256},
        "workers": {"count": 1, "budget_bytes": 4_000_000_000, "inbox_capacity": 64},
        "engine": {"max_batch_tokens": 512, "prefill_chunk_tokens": 256,
                   "prefix_reuse": True, "retain_prefixes": args.retain},
        "models": [{"id": MODEL, "kind": "generative", "backend": "llamacpp",
                    "task": "generation", "memory_bytes": 600_000_000,
                    "options": {"path": "packaged:gemma-3-270m", "n_ctx": n_ctx,
                                "n_seq_max": args.slots, "n_threads": args.threads}}],
        "cluster": {"app_name": f"bench-{router.replace('_', '-')}", "router": router,
                    "min_replicas": args.replicas, "max_replicas": args.replicas,
                    "num_cpus": 0.5, "ingress_num_cpus": 0.1,
                    "prefix_chars": args.prefix_chars, "max_queued_requests": 512},
    }


def run_router(router: str, args: argparse.Namespace, port: int, texts: list[str],
               picks: list[int], seed: int) -> dict[str, Any]:
    from sluice.cluster.app import run_app, stop_app
    from sluice.config import Config

    config = Config.model_validate(config_data(router, args, port))
    run_app(config)
    base = f"http://127.0.0.1:{port}"
    try:
        # Warm-up: one request per application, then let the replicas go idle.
        warm, _ = asyncio.run(open_loop(base, MODEL, texts[: args.apps], rate_per_s=2.0,
                                        n_requests=args.apps, max_tokens=2, seed=seed))
        time.sleep(1.0)
        samples, wall = asyncio.run(open_loop(base, MODEL, texts, rate_per_s=args.rate,
                                              n_requests=len(texts),
                                              max_tokens=args.max_tokens, seed=seed))
    finally:
        stop_app(config)
    summary = summarize(samples, wall, ttft_slo_s=2.0, tpot_slo_s=0.15)
    summary["router"] = router
    summary["ttft_s"] = [s.ttft_s for s in samples]
    summary["apps"] = picks
    summary["warmup_errors"] = sum(1 for s in warm if not s.ok)
    return summary


def pooled(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ttft = [t for r in runs for t in r["ttft_s"] if t is not None]
    tokens = sum(r["tokens"] for r in runs)
    wall = sum(r["wall_s"] for r in runs)
    return {"requests": sum(r["requests"] for r in runs), "ok": sum(r["ok"] for r in runs),
            "ttft_p50_s": percentile(ttft, 0.5), "ttft_p95_s": percentile(ttft, 0.95),
            "tokens_per_s": tokens / wall if wall else 0.0}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    routers = list(result["pooled"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for router in routers:
        ttft = sorted(t for r in result["runs"] if r["router"] == router
                      for t in r["ttft_s"] if t is not None)
        ax1.plot(ttft, [i / len(ttft) for i in range(1, len(ttft) + 1)], label=router)
    ax1.set_xlabel("TTFT (s)")
    ax1.set_ylabel("fraction of requests")
    ax1.set_title("TTFT distribution")
    ax1.legend()
    x = range(len(routers))
    p50 = [result["pooled"][r]["ttft_p50_s"] for r in routers]
    p95 = [result["pooled"][r]["ttft_p95_s"] for r in routers]
    ax2.bar([i - 0.2 for i in x], p50, width=0.4, label="TTFT p50")
    ax2.bar([i + 0.2 for i in x], p95, width=0.4, label="TTFT p95")
    ax2.set_xticks(list(x), [f"{r}\n{result['pooled'][r]['tokens_per_s']:.1f} tok/s"
                             for r in routers])
    ax2.set_ylabel("seconds")
    ax2.set_title(f"{result['params']['replicas']} replicas, {result['params']['apps']} "
                  f"system prompts, {result['params']['rate']} req/s")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--apps", type=int, default=4)
    ap.add_argument("--system-words", type=int, default=500)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--rate", type=float, default=0.6)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--ctx-per-seq", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prefix-chars", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--routers", default="affinity,round_robin")
    ap.add_argument("--no-retain", dest="retain", action="store_false",
                    help="engine.retain_prefixes = false (only running sequences donate)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "cluster_prefix.json"))
    args = ap.parse_args()

    import ray
    from ray import serve

    os.environ.setdefault("RAY_SERVE_QUEUE_LENGTH_RESPONSE_DEADLINE_S", "1.0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    routers = args.routers.split(",")
    runs = []
    try:
        for rep in range(args.repeats):
            texts, picks = prompts(args.apps, args.system_words, args.requests, seed=rep)
            order = routers if rep % 2 == 0 else list(reversed(routers))
            for router in order:
                run = run_router(router, args, port, texts, picks, seed=rep)
                run["repeat"] = rep
                runs.append(run)
                print(f"repeat {rep} {router:>12}: TTFT p50 {run['ttft_p50_s']:.3f} s "
                      f"p95 {run['ttft_p95_s']:.3f} s, {run['tokens_per_s']:.1f} tok/s, "
                      f"ok {run['ok']}/{run['requests']}", flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()
    result: dict[str, Any] = {
        "params": vars(args) | {"model": MODEL, "cpus": os.cpu_count()},
        "pooled": {r: pooled([x for x in runs if x["router"] == r]) for r in routers},
        "runs": runs,
    }
    if {"affinity", "round_robin"} <= set(routers):
        a, rr = result["pooled"]["affinity"], result["pooled"]["round_robin"]
        result["ratios"] = {
            "ttft_p50_round_robin_over_affinity": rr["ttft_p50_s"] / a["ttft_p50_s"],
            "ttft_p95_round_robin_over_affinity": rr["ttft_p95_s"] / a["ttft_p95_s"],
            "tokens_per_s_affinity_over_round_robin": a["tokens_per_s"] / rr["tokens_per_s"],
        }
        print(json.dumps(result["ratios"], indent=2))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=float))
    plot(result, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

