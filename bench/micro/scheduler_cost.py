"""What one scheduling decision costs: a push plus a pop, with the queue held at a steady size.

Run from the repository root: ``python bench/micro/scheduler_cost.py``. Prints a table of
microseconds per decision and writes ``bench/results/scheduler_cost.json``.

Workload (seeded): 10 models, 8 tenants (weights 1..4 for wfq), priorities 0..9, half the
requests with a deadline, token costs 16..2048. The queue is filled to the target size, then
each timed decision pushes one new request and pops one, so the size stays put.
"""

from __future__ import annotations

import json
import platform
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a plain script without installing the package

from sluice.policy.queues.scheduler import SCHEDULER_NAMES, make_scheduler  # noqa: E402
from sluice.policy.types import QueueItem  # noqa: E402

SEED = 20240611
QUEUE_SIZES = (1_000, 100_000)
TIMED_DECISIONS = 20_000
MODELS = [f"model-{i}" for i in range(10)]
TENANTS = [f"tenant-{i}" for i in range(8)]
TENANT_WEIGHTS = {t: float(1 + i % 4) for i, t in enumerate(TENANTS)}
OUT = ROOT / "bench" / "results" / "scheduler_cost.json"


def make_items(n: int, rng: random.Random, first_id: int) -> list[QueueItem]:
    items = []
    for k in range(n):
        arrival_s = (first_id + k) * 0.001
        items.append(
            QueueItem(
                request_id=first_id + k,
                model_id=rng.choice(MODELS),
                arrival_s=arrival_s,
                tenant_id=rng.choice(TENANTS),
                priority=rng.randrange(10),
                deadline_s=arrival_s + rng.uniform(0.5, 30.0) if rng.random() < 0.5 else None,
                cost_tokens=rng.randint(16, 2048),
            )
        )
    return items


def measure(name: str, queued: int) -> float:
    """Microseconds per (push + pop) at a steady queue of ``queued`` requests."""
    rng = random.Random(SEED)
    scheduler = make_scheduler(name, bypass_threshold=8, tenant_weights=TENANT_WEIGHTS)
    for item in make_items(queued, rng, 0):
        scheduler.push(item)
    timed = make_items(TIMED_DECISIONS, rng, queued)
    push, pop = scheduler.push, scheduler.pop
    start = time.perf_counter()
    for item in timed:
        push(item)
        pop(item.arrival_s)
    elapsed = time.perf_counter() - start
    assert len(scheduler) == queued
    return elapsed / TIMED_DECISIONS * 1e6


def main() -> None:
    rows = []
    for name in SCHEDULER_NAMES:
        for queued in QUEUE_SIZES:
            rows.append({"scheduler": name, "queued": queued,
                         "us_per_decision": round(measure(name, queued), 3)})
    print(f"{'scheduler':<16}" + "".join(f"{f'{q:,} queued':>16}" for q in QUEUE_SIZES))
    for name in SCHEDULER_NAMES:
        cells = [r["us_per_decision"] for r in rows if r["scheduler"] == name]
        print(f"{name:<16}" + "".join(f"{c:>13.2f} us" for c in cells))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({
        "what": "microseconds per scheduling decision (one push + one pop) at a steady queue",
        "timed_decisions": TIMED_DECISIONS,
        "seed": SEED,
        "models": len(MODELS),
        "tenants": len(TENANTS),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "results": rows,
    }, indent=2) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
