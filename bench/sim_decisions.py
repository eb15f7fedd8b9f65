"""Where the server's and the simulator's variant planners decide differently, request by
request: reads the ONNX points of ``bench/results/sim_validation.json`` (each request's
plan on both sides, ``decisions``: reason, arrival rate, its standard error, low-load
line; ``x-sluice-plan-arrival``) and prints, per point, the requests planned on
different sides of the low-load line, split by which input differed (the arrival rate,
or only the line: the most accurate variant's speed estimate at that moment), and each
side's reasons.

    python bench/sim_decisions.py [bench/results/sim_validation.json]
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import Counter
from pathlib import Path

Z = 2.0
"""The planner's ``low_load_confidence_z`` (the bench serves its default)."""


def parse(decision: str) -> tuple[str, float, float, float] | None:
    reason, *inputs = decision.split()
    if len(inputs) != 3:
        return None
    rate, stderr, line = map(float, inputs)
    return reason, rate, stderr, line


def below_line(d: tuple[str, float, float, float]) -> bool:
    return d[1] - Z * d[2] < d[3]


def main() -> int:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "bench/results/sim_validation.json")
    doc = json.loads(path.read_text())
    onnx = next(s for s in doc["systems"] if s["system"] == "onnx")
    for p in onnx["points"]:
        real = [parse(x) for x in p["real"].get("decisions") or []]
        sim = [parse(x) for x in p["sim"].get("decisions") or []]
        pairs = [(r, s) for r, s in zip(real, sim, strict=False) if r and s]
        if not pairs:
            print(f"{p['factor']}x: no per-request decisions recorded")
            continue
        split = [(r, s) for r, s in pairs if below_line(r) != below_line(s)]
        by_rate = sum(abs(r[1] - s[1]) > 1e-3 for r, s in split)
        print(f"{p['factor']}x ({p['rate_per_s']}/s, {len(pairs)} requests): other side of the "
              f"low-load line at {len(split)} (arrival rate differed: {by_rate}, only the "
              f"line: {len(split) - by_rate})")
        for i, side in ((0, "real"), (1, "sim")):
            xs = [pair[i] for pair in pairs]
            lines = [x[3] for x in xs]
            first, last = statistics.fmean(lines[:10]), statistics.fmean(lines[-100:])
            print(f"  {side:4s} reasons {dict(Counter(x[0] for x in xs).most_common())}; line "
                  f"mean {statistics.fmean(lines):.2f}/s, first 10 {first:.2f}, last 100 "
                  f"{last:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
