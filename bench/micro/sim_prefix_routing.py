"""Prediction: prefix-aware (affinity) against round-robin and least-loaded routing across
32 replicas of the packaged model, by simulation (the cluster's own replica routers and
the engine's step planner with prefix copies, the packaged model's measured step cost).

64 system prompts of 450 tokens (+20 own tokens each), 64 generated tokens, Poisson at
6, 15 and 25 requests/s over 32 replicas. A "fast first token" is one under 0.3 s: only
a prefix copy from a running sequence on the same replica makes that possible.
Writes bench/results/sim_prefix_routing.json.

    python bench/micro/sim_prefix_routing.py        # about 30 s of CPU
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sluice.config import load_config
from sluice.sim import SimConfig, generate, parse_spec, simulate
from sluice.sim.costs import read_costs

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"


def main() -> int:
    cfg = SimConfig.from_config(load_config(ROOT / "examples" / "pod.toml"),
                                read_costs(ROOT / "examples" / "sim_cost_gemma.json"))
    rows = []
    for rate in (6, 15, 25):
        spec = parse_spec(f"poisson:rate={rate},duration=300,model=gemma-3-270m,prompt=470,"
                          f"output=64,prefixes=64,prefix_tokens=450")
        for router in ("affinity", "round_robin", "least_loaded"):
            config = dataclasses.replace(cfg, replicas=32, replica_router=router)
            report, fleet = simulate(config, generate(spec, 0), keep_requests=True)
            reqs = fleet.requests or []
            fast = sum(1 for q in reqs if q.first_token_s is not None
                       and q.first_token_s - q.arrival_s < 0.3)
            o = report["overall"]
            row = {"rate_per_s": rate, "router": router, "ttft_p50_s": o["ttft_s"]["p50"],
                   "ttft_p95_s": o["ttft_s"]["p95"], "e2e_p95_s": o["e2e_s"]["p95"],
                   "goodput": o["goodput"], "fast_first_token_share": round(fast / len(reqs), 3)}
            rows.append(row)
            print(row, flush=True)
    (RESULTS / "sim_prefix_routing.json").write_text(json.dumps(
        {"replicas": 32, "prefixes": 64, "prefix_tokens": 450, "prompt_tokens": 470,
         "output_tokens": 64, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
