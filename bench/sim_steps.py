"""Engine steps as the clients saw them, closed loop against open loop: why a generative
model's steps under open-loop arrivals are slower than a closed-loop profile says.

Every running sequence gets its token at the end of the same step, so the tokens of all
streams, merged in time order, fall in bursts: one burst per step (gaps under
``--burst-ms`` join a burst). A step's time is the gap from the previous burst; its
decodes are the tokens in the burst that were not a request's first; a burst holding a
request's first token also fed its prompt (a prefill step). Steps are grouped by their
decodes, with and without a prefill, for a closed loop at 2, 4 and 8 streams and for
open-loop Poisson arrivals at the given loads; the same decode count taking longer under
open-loop load, with no prefill in the step, is a cost no (decode, prefill) step model
has.

    /work/wt/bin/heavy python bench/sim_steps.py --system gemma --rate 1.9,3.0

Writes bench/results/sim_steps_<system>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.loadgen import Sample, closed_loop
from bench.servers import free_port, running, sluice_cmd
from bench.sim_validation import RESULTS, SYSTEMS, open_loop_arrivals, poisson_arrivals


def steps(samples: list[Sample], burst_s: float) -> list[tuple[float, int, bool]]:
    """(seconds, decodes, had a prefill) per reconstructed step."""
    events = sorted((t, i == 0) for s in samples if s.token_times
                    for i, t in enumerate(s.token_times))
    out: list[tuple[float, int, bool]] = []
    prev_end: float | None = None
    burst: list[tuple[float, bool]] = []
    for t, first in events:
        if burst and t - burst[-1][0] > burst_s:
            end = burst[0][0]
            if prev_end is not None:
                out.append((end - prev_end, sum(not f for _, f in burst),
                            any(f for _, f in burst)))
            prev_end = end
            burst = []
        burst.append((t, first))
    return out


def table(rows: list[tuple[float, int, bool]]) -> dict[str, dict[str, float]]:
    by: dict[str, list[float]] = defaultdict(list)
    for seconds, decodes, prefill in rows:
        by[f"{decodes}{'+prefill' if prefill else ''}"].append(seconds)
    return {k: {"steps": len(v), "median_ms": round(statistics.median(v) * 1000, 1)}
            for k, v in sorted(by.items(), key=lambda kv: (int(kv[0].split("+")[0]), kv[0]))
            if len(v) >= 5}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--system", default="gemma")
    p.add_argument("--rate", default="1.9,3.0", help="open-loop arrivals per second")
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--burst-ms", type=float, default=3.0)
    args = p.parse_args()
    system = SYSTEMS[args.system]
    port = free_port()
    cmd, _ = sluice_cmd(system["toml"](), port)
    base = f"http://127.0.0.1:{port}"
    from bench.sim_validation import token_counts

    out: dict[str, Any] = {"system": args.system, "burst_ms": args.burst_ms, "runs": {}}
    with running(cmd, f"{base}/ready"):
        counts = asyncio.run(token_counts(base, system["model"], system["prompts"]))
        for c in (2, 4, 8):
            got, _ = asyncio.run(closed_loop(base, system["model"], system["prompts"],
                                             concurrency=c, n_requests=4 * c,
                                             max_tokens=system["max_tokens"]))
            out["runs"][f"closed {c}"] = table(steps(got, args.burst_ms / 1000))
        for rate in (float(r) for r in args.rate.split(",")):
            arrivals, prompt_of = poisson_arrivals(system, rate, args.duration, 7, 60_000,
                                                   counts)
            got, _, _ = asyncio.run(open_loop_arrivals(base, system["model"],
                                                       system["prompts"], arrivals,
                                                       prompt_of, 60_000, f"s{rate:g}"))
            out["runs"][f"open {rate:g}/s"] = table(steps(got, args.burst_ms / 1000))
    for name, t in out["runs"].items():
        print(name, {k: (v["steps"], v["median_ms"]) for k, v in t.items()}, flush=True)
    path = RESULTS / f"sim_steps_{args.system}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
