"""Load-step bench of the variant planner: Poisson arrivals of real labelled text against
the ``sentiment`` group at ρ = 0.4 of the accurate-only capacity, a step to ρ = 1.3 at a
known time, and back to 0.4 (``--phases``). Per policy (a fresh server each, the same
arrivals per repeat) it reports:

* the in-deadline share over time, and **the time after the step up until it is back
  above 99 %**: the end of the last 0.5 s window of arrivals (windows start every
  0.1 s from the step) whose share of answers within the deadline is below 99 %;
* the variant mix over time (which variant served the requests that arrived in each
  0.25 s bin), and after the step down **the time until the accurate variant serves
  ≥ 90 % again**;
* the mix before the step (below half load: all on the accurate variant, as
  accurate-only).

    .venv/bin/python bench/goodput_step.py \
        --capacity-per-s 22 --deadline-ms 150

Writes ``bench/results/goodput_step.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.goodput_sweep import (  # noqa: E402
    POLICIES,
    RESULTS,
    SENDS_DEADLINE,
    add_server_args,
    arrival_offsets,
    closed_loop,
    load_texts,
    miss_line,
    misses,
    open_loop,
    serve,
    setup,
    warm,
)

WINDOW_S = 0.5
"""The in-deadline share is judged over arrivals in windows this long ..."""
WINDOW_STEP_S = 0.1
"""... starting this often."""
BIN_S = 0.25
"""The variant mix over time: arrivals binned this finely."""


def phased_offsets(phases: list[tuple[float, float]], capacity_per_s: float,
                   seed: int) -> list[float]:
    """Poisson arrivals through ``(ρ, seconds)`` phases, one after another."""
    out: list[float] = []
    start = 0.0
    for k, (rho, seconds) in enumerate(phases):
        out += [start + at for at in
                arrival_offsets("poisson", rho * capacity_per_s, seconds, seed + k)]
        start += seconds
    return out


def in_deadline(sample: dict[str, Any], deadline_ms: float) -> bool:
    return bool(sample["status"] == 200 and sample["latency_s"] * 1000 <= deadline_ms)


def window_shares(samples: list[dict[str, Any]], deadline_ms: float, start_s: float,
                  end_s: float) -> list[tuple[float, float, int]]:
    """``(window start, in-deadline share, arrivals)`` of each ``WINDOW_S`` window of
    arrivals starting at ``start_s + k·WINDOW_STEP_S`` and ending by ``end_s``."""
    out = []
    k = 0
    while start_s + k * WINDOW_STEP_S + WINDOW_S <= end_s + 1e-9:
        w = start_s + k * WINDOW_STEP_S
        inside = [s for s in samples if w <= s["at_s"] < w + WINDOW_S]
        if inside:
            share = sum(in_deadline(s, deadline_ms) for s in inside) / len(inside)
            out.append((w, share, len(inside)))
        k += 1
    return out


def recovery_s(samples: list[dict[str, Any]], deadline_ms: float, step_s: float,
               end_s: float, target: float = 0.99) -> float:
    """Seconds after ``step_s`` until the windowed in-deadline share stays >= ``target``
    (to ``end_s``): the end of the last window below it, 0 if none is."""
    bad = [w for w, share, _ in window_shares(samples, deadline_ms, step_s, end_s)
           if share < target]
    return max(bad) + WINDOW_S - step_s if bad else 0.0


def back_on_best_s(samples: list[dict[str, Any]], best: str, step_s: float, end_s: float,
                   target: float = 0.9) -> float | None:
    """Seconds after ``step_s`` until the first ``WINDOW_S`` window of arrivals whose
    answered requests are >= ``target`` on ``best`` (``None``: never, by ``end_s``)."""
    k = 0
    while step_s + k * WINDOW_STEP_S + WINDOW_S <= end_s + 1e-9:
        w = step_s + k * WINDOW_STEP_S
        ok = [s for s in samples if w <= s["at_s"] < w + WINDOW_S and s["status"] == 200]
        if ok and sum(s["variant"] == best for s in ok) / len(ok) >= target:
            return w + WINDOW_S - step_s
        k += 1
    return None


def mix_over_time(samples: list[dict[str, Any]], end_s: float) -> dict[str, list[float]]:
    """Per variant: the share of each ``BIN_S`` bin's answered arrivals it served."""
    bins = int(end_s / BIN_S + 0.5)
    counts: dict[str, list[int]] = {}
    totals = [0] * bins
    for s in samples:
        if s["status"] != 200:
            continue
        b = min(bins - 1, int(s["at_s"] / BIN_S))
        totals[b] += 1
        counts.setdefault(s["variant"].removeprefix("sentiment-"), [0] * bins)[b] += 1
    return {v: [c / t if t else 0.0 for c, t in zip(row, totals, strict=True)]
            for v, row in counts.items()}


def summarize_run(samples: list[dict[str, Any]], phases: list[tuple[float, float]],
                  deadline_ms: float, best: str) -> dict[str, Any]:
    up_s = phases[0][1]
    down_s = up_s + phases[1][1] if len(phases) > 2 else None
    end_s = sum(sec for _, sec in phases)
    before = [s for s in samples if s["at_s"] < up_s and s["status"] == 200]
    after_up = [s for s in samples if up_s <= s["at_s"] < (down_s or end_s)]
    return {
        "sent": len(samples),
        "in_deadline": sum(in_deadline(s, deadline_ms) for s in samples) / len(samples),
        "in_deadline_after_step": (sum(in_deadline(s, deadline_ms) for s in after_up)
                                   / len(after_up)) if after_up else None,
        "recovery_s": recovery_s(samples, deadline_ms, up_s, down_s or end_s),
        "share_on_best_before_step": (sum(s["variant"] == f"sentiment-{best}" for s in before)
                                      / len(before)) if before else None,
        "back_on_best_after_step_down_s": None if down_s is None else back_on_best_s(
            samples, f"sentiment-{best}", down_s, end_s),
        "windows": window_shares(samples, deadline_ms, 0.0, end_s),
        "mix_over_time": mix_over_time(samples, end_s),
        "failures": {k: sum(1 for s in samples if f"{s['status']}:{s.get('code')}" == k)
                     for k in {f"{s['status']}:{s.get('code')}" for s in samples
                               if s["status"] != 200}},
        "misses": misses(samples, deadline_ms),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_server_args(p)
    p.add_argument("--phases", default="0.4:8,1.3:8,0.4:8",
                   help="ρ:seconds, ... (the step up is at the end of the first phase)")
    p.add_argument("--policies", default="adaptive,fastest")
    p.add_argument("--deadline-ms", type=float, default=150.0)
    p.add_argument("--capacity-per-s", type=float,
                   help="the accurate-only capacity (default: measured, 8 s closed loop)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=str(RESULTS / "goodput_step.json"))
    p.add_argument("--render", metavar="JSON", help="redraw an earlier result and exit")
    args = p.parse_args()
    if args.render:
        write(json.loads(Path(args.render).read_text()), Path(args.render))
        return 0
    phases = [(float(r), float(sec)) for r, sec in
              (part.split(":") for part in args.phases.split(","))]
    policies = [x for x in args.policies.split(",") if x]
    if set(policies) - set(POLICIES):
        p.error(f"unknown policies {policies}; choose from {POLICIES}")
    manifest, profile = setup(args)
    texts = load_texts(manifest, seed=7)
    capacity = args.capacity_per_s
    if not capacity:
        ctx, url, _ = serve(manifest, "accurate", args, profile, "capacity")
        with ctx:
            warm(url, args.variants[:1])
            capacity = max(asyncio.run(closed_loop(url, "sentiment", texts, c, 8.0))
                           for c in (2, 4))
    print(f"capacity {capacity:.1f}/s, phases {phases}, deadline {args.deadline_ms} ms",
          flush=True)
    runs = []
    for rep in range(args.repeats):
        offsets = phased_offsets(phases, capacity, seed=5000 + 10 * rep)
        for policy in policies:
            ctx, url, _ = serve(manifest, policy, args, profile, f"step-{policy}")
            with ctx:
                warm(url, args.variants)
                samples = asyncio.run(open_loop(
                    url, "sentiment", texts, offsets,
                    args.deadline_ms if SENDS_DEADLINE[policy] else None))
            run = {"repeat": rep, "policy": policy,
                   **summarize_run(samples, phases, args.deadline_ms, args.variants[0])}
            runs.append(run)
            print(f"rep {rep} {policy:<8} in deadline {run['in_deadline']:.2%} (after the "
                  f"step {run['in_deadline_after_step']:.2%}), back above 99 % after "
                  f"{run['recovery_s']:.2f} s; on {args.variants[0]} before the step "
                  f"{run['share_on_best_before_step']:.0%}, back on it "
                  f"{run['back_on_best_after_step_down_s']} s after the step down; "
                  f"failures {run['failures']}", flush=True)
            for m in run["misses"]:
                print(f"    miss {miss_line(m)}", flush=True)
    write({"variants": {v: manifest["variants"][v]["accuracy"] for v in args.variants},
           "capacity_per_s": capacity, "phases": phases, "deadline_ms": args.deadline_ms,
           "repeats": args.repeats, "pessimism": args.pessimism, "runs": runs},
          Path(args.out))
    return 0


def write(result: dict[str, Any], out: Path) -> None:
    """The JSON, the PNG and a summary per policy on stdout."""
    result["summary"] = {}
    for policy in dict.fromkeys(r["policy"] for r in result["runs"]):
        mine = [r for r in result["runs"] if r["policy"] == policy]
        rec = [r["recovery_s"] for r in mine]
        back = [r["back_on_best_after_step_down_s"] for r in mine]
        result["summary"][policy] = {
            "recovery_s_mean": statistics.fmean(rec), "recovery_s_max": max(rec),
            "in_deadline_mean": statistics.fmean(r["in_deadline"] for r in mine),
            "in_deadline_min": min(r["in_deadline"] for r in mine),
            "share_on_best_before_step_mean": statistics.fmean(
                r["share_on_best_before_step"] or 0.0 for r in mine),
            "back_on_best_after_step_down_s": back,
        }
        print(f"{policy}: {result['summary'][policy]}")
    out.write_text(json.dumps(result, indent=1) + "\n")
    plot(result, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = result["phases"]
    edges = [sum(sec for _, sec in phases[:k + 1]) for k in range(len(phases) - 1)]
    fig, (a, b) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    for policy in result["summary"]:
        mine = [r for r in result["runs"] if r["policy"] == policy]
        starts = [w for w, _, _ in mine[0]["windows"]]
        shares = [statistics.fmean(r["windows"][i][1] for r in mine
                                   if i < len(r["windows"]))
                  for i in range(len(starts))]
        rec = result["summary"][policy]["recovery_s_mean"]
        a.plot([w + WINDOW_S for w in starts], shares, label=f"{policy} (back above 99 % "
               f"{rec:.2f} s after the step, mean of {len(mine)})")
    a.axhline(0.99, color="grey", lw=0.8, ls=":")
    a.set_ylabel(f"answered within {result['deadline_ms']:.0f} ms\n"
                 f"(arrivals of the last {WINDOW_S} s)")
    a.set_ylim(0.5, 1.01)
    a.legend(loc="lower left")
    adaptive = [r for r in result["runs"] if r["policy"] == "adaptive"]
    if adaptive:
        names = [v for v in result["variants"]
                 if any(v in r["mix_over_time"] for r in adaptive)]
        bins = max(len(next(iter(r["mix_over_time"].values()), [])) for r in adaptive)
        x = [BIN_S * (i + 0.5) for i in range(bins)]
        layers = [[statistics.fmean(r["mix_over_time"].get(v, [0.0] * bins)[i]
                                    for r in adaptive) for i in range(bins)] for v in names]
        b.stackplot(x, layers, labels=names, alpha=0.85)
        b.legend(loc="lower left", fontsize=8)
    b.set_ylabel("adaptive: share of answers\nby variant (arrival time)")
    b.set_xlabel("seconds")
    for ax in (a, b):
        for e in edges:
            ax.axvline(e, color="black", lw=1, ls="--")
        ax.grid(alpha=0.3)
    rhos = " → ".join(f"{r}" for r, _ in phases)
    fig.suptitle(f"load step ρ {rhos} (capacity {result['capacity_per_s']:.0f}/s), "
                 f"deadline {result['deadline_ms']:.0f} ms")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
