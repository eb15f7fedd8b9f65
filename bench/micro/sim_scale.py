"""Scale: how the simulator's cost grows with the requests it simulates.

A fleet no single machine holds: 32 replicas × 8 workers (256 workers), an embedding
model (dynamic batching, 4 ms + 1 ms per item) and ten tenants, one of them limited to
1,000 requests/s by a quota all replicas share (the Redis store, modelled as exact),
routed across replicas by the least-loaded front end. Poisson arrivals at 80 % of the
fleet's batch-1 capacity; 10 k, 100 k and 1 M requests, each run once on one core
(``time.process_time``), then one 100 k run under cProfile to say where the time goes.
An LLM fleet (32 × 1 workers, 8 slots, the continuous-batching step planner every step) is
run at 10 k and 100 k requests to show the cost of a step-planned request.

Writes bench/results/sim_scale.json and .png.

    python bench/micro/sim_scale.py        # about 2 minutes
"""

from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import json
import platform
import pstats
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sluice.policy.capacity.quota import QuotaLimits
from sluice.policy.queues.control_core import QueueConfig
from sluice.policy.step.step_cost import StepCost
from sluice.policy.worker_config import WorkerConfig
from sluice.sim import SimConfig, SimModel, generate, parse_spec, simulate
from sluice.sim.costs import ModelCost

RESULTS = Path(__file__).resolve().parents[1] / "results"
MB = 1_000_000


def oneshot_fleet() -> tuple[SimConfig, float]:
    enc = SimModel("enc", "oneshot", 300 * MB, 0.5, ModelCost(0.0, (1, 8), (0.005, 0.012)))
    quota = QuotaLimits(requests_per_s=1000.0, request_burst=1000.0, tokens_per_s=None,
                        token_capacity=1.0, max_concurrent=None)
    config = SimConfig(models={"enc": enc}, replicas=32, workers=8,
                       worker=WorkerConfig(0, budget_bytes=1000 * MB, inbox_capacity=8),
                       queue=QueueConfig(queue_capacity=256),
                       tenant_limits={"t0": quota})
    rate = 0.8 * 256 / 0.005
    return config, rate


def llm_fleet() -> tuple[SimConfig, float]:
    chat = SimModel("chat", "generative", 600 * MB, 1.0,
                    ModelCost(1.0, step=StepCost(0.012, 0.0038, 0.00012)),
                    n_seq_max=8, n_ctx_total=8192)
    config = SimConfig(models={"chat": chat}, replicas=32, workers=1,
                       worker=WorkerConfig(0, budget_bytes=2000 * MB, inbox_capacity=8),
                       queue=QueueConfig(queue_capacity=64))
    # 8 sequences of 32 tokens: about 32 steps of ~45 ms → ~5.5 requests/s a replica
    return config, 0.8 * 32 * 5.5


def run(config: SimConfig, rate: float, n: int, model: str, extra: str = "",
        profile: bool = False) -> dict[str, Any]:
    tenants = "|".join(f"t{i}" for i in range(10))
    spec = parse_spec(f"poisson:rate={rate},requests={n},model={model},tenant={tenants}{extra}")
    prof = cProfile.Profile() if profile else None
    cpu0, wall0 = time.process_time(), time.perf_counter()
    if prof is not None:
        prof.enable()
    report, _ = simulate(config, generate(spec, seed=1))
    if prof is not None:
        prof.disable()
    cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
    out: dict[str, Any] = {
        "requests": n, "workers": report["workers"], "cpu_s": round(cpu_s, 3),
        "wall_s": round(wall_s, 3), "us_per_request": round(cpu_s / n * 1e6, 2),
        "events": report["events"], "simulated_s": report["drained_at_s"],
        "goodput": report["overall"]["goodput"], "rejections": report["rejections"],
        "utilisation": report["utilisation"],
    }
    if prof is not None:
        out["profile"] = where_time_goes(prof)
    print(f"{model} n={n:>8}: {cpu_s:7.2f} s cpu ({out['us_per_request']} µs/request, "
          f"{report['events']} events), goodput {out['goodput']}", flush=True)
    return out


def where_time_goes(prof: cProfile.Profile) -> dict[str, Any]:
    """Own time by module (sluice.policy vs sluice.sim vs the rest), and the top functions."""
    stats = pstats.Stats(prof)
    by_area: dict[str, float] = {}
    rows = []
    total = 0.0
    for (filename, line, func), (_cc, _nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        total += tt
        if "/sluice/policy/" in filename:
            area = "policy/" + Path(filename).name
        elif "/sluice/sim/" in filename:
            area = "sim/" + Path(filename).name
        else:
            area = "other (heapq, dataclasses, builtins)"
        by_area[area] = by_area.get(area, 0.0) + tt
        rows.append((tt, ct, f"{Path(filename).name}:{line}({func})"))
    rows.sort(reverse=True)
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(12)
    return {"own_s_by_area": {k: round(v, 3) for k, v in
                              sorted(by_area.items(), key=lambda kv: -kv[1])},
            "total_s": round(total, 3),
            "top_functions": [{"function": f, "own_s": round(tt, 3), "cum_s": round(ct, 3)}
                              for tt, ct, f in rows[:15]]}


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in (("oneshot", "256 workers, one-shot"), ("llm", "32 LLM replicas")):
        runs = doc[key]
        ax.loglog([r["requests"] for r in runs], [r["cpu_s"] for r in runs], "o-", label=label)
    ax.axhline(60, color="grey", linestyle=":", label="60 s")
    ax.set_xlabel("simulated requests")
    ax.set_ylabel("CPU seconds (one core)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="10000,100000,1000000")
    p.add_argument("--llm-sizes", default="10000,100000")
    p.add_argument("--out", default=str(RESULTS / "sim_scale.json"))
    args = p.parse_args()
    config, rate = oneshot_fleet()
    oneshot = [run(config, rate, int(n), "enc") for n in args.sizes.split(",")]
    profiled = run(config, rate, 100_000, "enc", profile=True)
    llm_config, llm_rate = llm_fleet()
    llm = [run(llm_config, llm_rate, int(n), "chat", ",prompt=64,output=32")
           for n in args.llm_sizes.split(",")]
    llm_profiled = run(llm_config, llm_rate, 10_000, "chat", ",prompt=64,output=32",
                       profile=True)
    doc = {"machine": {"python": platform.python_version(), "cpu": platform.processor()},
           "oneshot": oneshot, "oneshot_profile_100k": profiled["profile"],
           "llm": llm, "llm_profile_10k": llm_profiled["profile"]}
    for key in ("oneshot", "llm"):
        runs = doc[key]
        doc[f"{key}_growth"] = [round(b["us_per_request"] / a["us_per_request"], 3)
                                for a, b in itertools.pairwise(runs)]
    out = Path(args.out)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    plot(doc, out.with_suffix(".png"))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
