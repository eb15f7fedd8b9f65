"""Validation: the simulator against the real server, same workload, same seed.

For each system (the synthetic backend, the packaged Gemma 3 270M through llama.cpp), on
127.0.0.1, one at a time:

1. **profile through the serving path** (closed loops of streaming completions at
   concurrency 1, 2, 4, 8, and lone short and long prompts): TPOT at concurrency ``c``
   is a step of ``c`` decodes, a lone TTFT a prefill step plus the time outside the
   worker; from these the ``StepCost`` the simulator charges and the latency each
   request spends outside the worker (``bench/results/sim_cost_<system>.json``, a
   ``--costs`` file). The synthetic system is also simulated
   with its declared cost options, to show what the serving path adds;
2. **capacity**: a closed loop at concurrency = the sequence slots (requests/s);
3. for each load factor (0.5, 0.8, 0.95, 1.3 × capacity): one Poisson arrival list
   (seeded), each request with ``x-sluice-deadline-ms``; the real server gets it open
   loop over HTTP, the simulator the same arrivals (prompt token counts from the server's
   ``/tokenize``). Compared: TTFT p95 of completed requests and goodput (the share of
   requests completed by their deadline), with the tolerance (15 %) on each.

Writes bench/results/sim_validation.json and .png.

    flock /tmp/sluice-heavy.lock python bench/sim_validation.py               # both
    python bench/sim_validation.py --systems synthetic --duration 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.loadgen import Sample, closed_loop, stream_completion
from bench.overload import LLM_PROMPTS, SYNTH_PROMPTS, llm_toml, synthetic_toml
from bench.servers import free_port, running, sluice_cmd
from sluice.config import Config
from sluice.policy.step_cost import StepCost, StepSample, fit_step_cost
from sluice.sim import Arrival, SimConfig, generate, parse_spec, simulate
from sluice.sim.costs import read_costs

RESULTS = Path(__file__).resolve().parent / "results"
FACTORS = (0.5, 0.8, 0.95, 1.3)
TOLERANCE = 0.15
PROFILE_CONCURRENCY = (1, 2, 4, 8)

SYSTEMS: dict[str, dict[str, Any]] = {
    "synthetic": {"toml": synthetic_toml, "model": "synth-chat", "prompts": SYNTH_PROMPTS,
                  "max_tokens": 16, "slots": 8},
    "gemma": {"toml": llm_toml, "model": "gemma-3-270m", "prompts": LLM_PROMPTS,
              "max_tokens": 32, "slots": 8},
}


def pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def p95(values: list[float]) -> float | None:
    return pct(values, 95)


async def token_counts(base: str, model: str, prompts: list[str]) -> list[int]:
    async with httpx.AsyncClient() as client:
        out = []
        for p in prompts:
            r = await client.post(f"{base}/tokenize", json={"model": model, "content": p,
                                                             "add_special": True})
            r.raise_for_status()
            out.append(len(r.json()["tokens"]))
        return out


async def profile(base: str, system: dict[str, Any], n_short: int, n_long: int
                  ) -> tuple[StepCost, float, list[dict[str, Any]]]:
    """The step-time model and the per-request overhead, through the serving path.

    TPOT at concurrency ``c`` is one step of ``c`` decodes: those samples, and the same
    decodes over long prompts, fit the base, per-decode and per-context-token seconds
    (``fit_step_cost``). TTFT of a lone request is the overhead
    outside the worker (HTTP, tokenization, streaming) plus one prefill step; lone short
    and long prompts give the per-prefill-token seconds (their difference) and then the
    overhead (what the short prompt's TTFT leaves after its step). The spread of the gaps
    between a request's tokens with every slot busy is the spread of step times (``cv``)."""
    m, model = system["max_tokens"], system["model"]
    decodes: list[StepSample] = []
    rows: list[dict[str, Any]] = []
    cv = 0.0
    for c in PROFILE_CONCURRENCY:
        got, _ = await closed_loop(base, model, system["prompts"], concurrency=c,
                                   n_requests=max(8, 3 * c), max_tokens=m)
        tpot = statistics.median(s.tpot_s for s in got if s.ok and s.tpot_s is not None)
        decodes.append(StepSample(c, 0, tpot, c * (n_short + m // 2)))
        cvs = [s.itl_cv for s in got if s.ok and s.itl_cv is not None]
        cv = statistics.median(cvs) if cvs else 0.0  # the last: every slot busy
        rows.append({"concurrency": c, "tpot_s": round(tpot, 6), "itl_cv": round(cv, 4)})
    c = PROFILE_CONCURRENCY[-1]  # the same decodes over long prompts: the context's cost
    got, _ = await closed_loop(base, model, long_prompts(system), concurrency=c,
                               n_requests=c, max_tokens=m)
    tpot = statistics.median(s.tpot_s for s in got if s.ok and s.tpot_s is not None)
    decodes.append(StepSample(c, 0, tpot, c * (n_long + m // 2)))
    rows.append({"concurrency": c, "long_prompts": True, "tpot_s": round(tpot, 6)})
    ttft = {}
    for label, prompts in (("short", system["prompts"]), ("long", long_prompts(system))):
        got, _ = await closed_loop(base, model, prompts, concurrency=1, n_requests=8,
                                   max_tokens=2)
        ttft[label] = statistics.median(s.ttft_s for s in got if s.ok and s.ttft_s is not None)
    decode_fit = fit_step_cost(decodes, with_context=True)
    per_prefill_s = max(0.0, (ttft["long"] - ttft["short"]) / max(1, n_long - n_short))
    step = StepCost(decode_fit.base_s, decode_fit.per_decode_token_s, per_prefill_s,
                    decode_fit.per_context_token_s)
    overhead_s = max(0.0, ttft["short"] - step.predict_s(0, n_short))
    rows.append({"ttft_short_s": round(ttft["short"], 6), "ttft_long_s": round(ttft["long"], 6),
                 "n_short": n_short, "n_long": n_long})
    return step, overhead_s, cv, rows


def long_prompts(system: dict[str, Any]) -> list[str]:
    """The prompts, each eight times over (a prefill about eight times longer)."""
    return [" ".join([p] * 8) for p in system["prompts"]]


async def open_loop_arrivals(base: str, model: str, prompts: list[str], arrivals: list[Arrival],
                             prompt_of: list[int], deadline_ms: float) -> list[Sample]:
    headers = {"x-sluice-deadline-ms": f"{deadline_ms:.0f}"}
    limits = httpx.Limits(max_connections=len(arrivals) + 4)
    async with httpx.AsyncClient(limits=limits) as client:
        t0 = time.perf_counter()
        tasks = []
        for a, i in zip(arrivals, prompt_of, strict=True):
            delay = t0 + a.time_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(stream_completion(
                client, base, model, prompts[i], a.output_tokens, headers=headers)))
        return list(await asyncio.gather(*tasks))


def real_summary(samples: list[Sample], max_tokens: int) -> dict[str, Any]:
    done = [s for s in samples if s.ok and s.tokens == max_tokens]
    states = {"completed": len(done),
              "rejected": sum(s.status in (429, 503) for s in samples),
              "expired": sum(s.status == 200 and s.error is not None and "deadline" in s.error
                             for s in samples)}
    states["other"] = len(samples) - sum(states.values())
    ttft = [s.ttft_s for s in done if s.ttft_s is not None]
    return {"offered": len(samples), "states": states,
            "goodput": len(done) / len(samples) if samples else None,
            "ttft_p95_s": p95(ttft), "e2e_p95_s": p95([s.latency_s for s in done]),
            "ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99),
            "tpot_p50_s": pct([s.tpot_s for s in done if s.tpot_s is not None], 50)}


def sim_summary(config: SimConfig, arrivals: list[Arrival]) -> dict[str, Any]:
    report, _ = simulate(config, arrivals)
    o = report["overall"]
    return {"offered": o["offered"], "states": o["states"], "goodput": o["goodput"],
            "ttft_p95_s": o["ttft_s"]["p95"], "e2e_p95_s": o["e2e_s"]["p95"],
            "ttft_p50_s": o["ttft_s"]["p50"], "ttft_p99_s": o["ttft_s"]["p99"],
            "tpot_p50_s": o["tpot_s"]["p50"]}


def rel_err(sim: float | None, real: float | None) -> float | None:
    if sim is None or real is None or real == 0:
        return None
    return (sim - real) / real


def run_system(name: str, args: argparse.Namespace) -> dict[str, Any]:
    system = SYSTEMS[name]
    toml = system["toml"]()
    port = free_port()
    cmd, cfg_path = sluice_cmd(toml, port)
    base = f"http://127.0.0.1:{port}"
    from sluice.config import load_config

    config: Config = load_config(cfg_path)
    out: dict[str, Any] = {"system": name, "model": system["model"], "points": []}
    log = RESULTS / f".sim_validation_{name}.log"
    with running(cmd, f"{base}/ready", log_path=log):
        counts = asyncio.run(token_counts(base, system["model"], system["prompts"]))
        long_counts = asyncio.run(token_counts(base, system["model"], long_prompts(system)))
        n_short = round(statistics.fmean(counts))
        fitted, overhead_s, cv, rows = asyncio.run(
            profile(base, system, n_short, round(statistics.fmean(long_counts))))
        (RESULTS / f"sim_cost_{name}.json").write_text(json.dumps(
            {system["model"]: {"step_cost": fitted.to_json(),
                               "overhead_ms": round(overhead_s * 1000, 3),
                               "cv": round(cv, 4)}}, indent=2) + "\n")
        out["profile"] = {"measured": rows, "fitted": fitted.to_json(),
                          "overhead_s": round(overhead_s, 6), "prompt_tokens": counts}
        slots = system["slots"]
        got, wall = asyncio.run(closed_loop(base, system["model"], system["prompts"],
                                            concurrency=slots, n_requests=slots * args.rounds,
                                            max_tokens=system["max_tokens"]))
        capacity = sum(s.ok for s in got) / wall
        full_latency = statistics.median(s.latency_s for s in got if s.ok)
        deadline_ms = args.deadline_factor * full_latency * 1000
        out.update(capacity_per_s=round(capacity, 3), deadline_ms=round(deadline_ms, 1),
                   full_latency_s=round(full_latency, 4))
        print(f"[{name}] fitted {fitted}, overhead {overhead_s * 1000:.1f} ms; capacity "
              f"{capacity:.2f}/s; deadline {deadline_ms:.0f} ms", flush=True)
        fitted_sim = SimConfig.from_config(
            config, read_costs(RESULTS / f"sim_cost_{name}.json"), RESULTS)
        declared_sim = SimConfig.from_config(config) if name == "synthetic" else None
        for factor in args.factors:
            rate = factor * capacity
            spec = parse_spec(f"poisson:rate={rate},duration={args.duration},"
                              f"model={system['model']},output={system['max_tokens']},"
                              f"deadline_ms={deadline_ms}")
            arrivals = list(generate(spec, seed=args.seed))
            prompt_of = [i % len(system["prompts"]) for i in range(len(arrivals))]
            arrivals = [replace(a, prompt_tokens=counts[i])
                        for a, i in zip(arrivals, prompt_of, strict=True)]
            real = real_summary(asyncio.run(open_loop_arrivals(
                base, system["model"], system["prompts"], arrivals, prompt_of, deadline_ms)),
                system["max_tokens"])
            time.sleep(2.0)  # let the server drain before the next point
            point = {"factor": factor, "rate_per_s": round(rate, 3), "requests": len(arrivals),
                     "real": real, "sim": sim_summary(fitted_sim, arrivals)}
            if declared_sim is not None:
                point["sim_declared_cost"] = sim_summary(declared_sim, arrivals)
            sim = point["sim"]
            point["ttft_p95_rel_err"] = rel_err(sim["ttft_p95_s"], real["ttft_p95_s"])
            point["goodput_rel_err"] = rel_err(sim["goodput"], real["goodput"])
            point["within_tolerance"] = all(
                e is not None and abs(e) <= TOLERANCE
                for e in (point["ttft_p95_rel_err"], point["goodput_rel_err"]))
            out["points"].append(point)
            print(f"[{name}] {factor}x ({rate:.1f}/s, n={len(arrivals)}): TTFT p95 real "
                  f"{fmt(real['ttft_p95_s'])} sim {fmt(sim['ttft_p95_s'])}; goodput real "
                  f"{real['goodput']:.3f} sim {sim['goodput']:.3f}; ok="
                  f"{point['within_tolerance']}", flush=True)
    return out


def fmt(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(results), figsize=(5.5 * len(results), 7), squeeze=False)
    for col, res in enumerate(results):
        f = [p["factor"] for p in res["points"]]
        for row, (key, label) in enumerate((("ttft_p95_s", "TTFT p95 (ms)"),
                                            ("goodput", "goodput"))):
            ax = axes[row][col]
            scale = 1000 if key.endswith("_s") else 1
            for who, style in (("real", "o-"), ("sim", "s--"), ("sim_declared_cost", "x:")):
                ys = [(p[who][key] or 0) * scale for p in res["points"] if who in p]
                if ys:
                    ax.plot(f[:len(ys)], ys, style, label=who.replace("_", " "))
            ax.set_xlabel("load (× measured capacity)")
            ax.set_ylabel(label)
            ax.set_title(f"{res['system']}: {label}")
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", default="synthetic,gemma")
    p.add_argument("--factors", default=",".join(map(str, FACTORS)),
                   type=lambda s: [float(x) for x in s.split(",")])
    p.add_argument("--duration", type=float, default=40.0, help="seconds of arrivals per point")
    p.add_argument("--rounds", type=int, default=4, help="closed-loop rounds for capacity")
    p.add_argument("--deadline-factor", type=float, default=4.0,
                   help="deadline = this × the median latency with every slot busy")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default=str(RESULTS / "sim_validation.json"))
    args = p.parse_args()
    out_path = Path(args.out)
    previous = json.loads(out_path.read_text()) if out_path.exists() else {}
    kept = {r["system"]: r for r in previous.get("systems", [])}
    for name in args.systems.split(","):
        kept[name] = run_system(name, args)
    results = [kept[n] for n in SYSTEMS if n in kept]
    doc = {"machine": {"python": platform.python_version(), "cores": os.cpu_count(),
                       "loadavg_at_end": os.getloadavg()},
           "tolerance": TOLERANCE, "seed": args.seed, "duration_s": args.duration,
           "systems": results}
    out_path.write_text(json.dumps(doc, indent=2) + "\n")
    plot(results, out_path.with_suffix(".png"))
    bad = [(r["system"], p["factor"]) for r in results for p in r["points"]
           if not p["within_tolerance"]]
    print(f"wrote {out_path}; outside tolerance: {bad or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
