"""``sluice plan``: the fewest replicas, and the scheduler and batch settings, that meet an
SLO for a workload, searched with the simulator (``sluice.sim.plan``), and the autoscaling
target per replica."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from sluice.cli.fleet import add_fleet_args, fleet_config, workload


def cmd_plan(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from sluice.sim.plan import parse_slo, plan, shaped, waiting_target

    config = fleet_config(args)
    spec, arrivals = workload(args)
    slo = parse_slo(args.slo)
    materialised = list(arrivals)
    console = Console(stderr=True)

    def ints(text: str | None) -> list[int]:
        return [int(x) for x in text.split(",")] if text else []

    def show(c: Any) -> None:
        console.print(f"  {c.scheduler} batch={c.max_batch_size} tokens={c.max_batch_tokens}: "
                      f"{c.replicas if c.replicas is not None else 'not met'} replicas "
                      f"({c.runs} runs)")

    candidates = plan(config, materialised, slo,
                      schedulers=args.schedulers.split(",") if args.schedulers else (),
                      max_batch_sizes=ints(args.batch_sizes),
                      max_batch_tokens=ints(args.batch_tokens),
                      max_replicas=args.max_replicas, progress=show)
    best = candidates[0]
    result: dict[str, Any] = {
        "slo": dataclasses.asdict(slo), "workload": args.workload or args.trace,
        "workers_per_replica": config.workers,
        "best": dataclasses.asdict(best) if best.replicas is not None else None,
        "candidates": [dataclasses.asdict(c) for c in candidates],
    }
    if best.replicas is not None and spec is not None and slo.ttft_p95_s is not None:
        best_config = shaped(config, best.scheduler, best.max_batch_size,
                             best.max_batch_tokens)
        result["autoscaling"] = waiting_target(best_config, spec, best.replicas,
                                               slo.ttft_p95_s, seed=args.seed)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps(result, indent=2))
        return 0 if best.replicas is not None else 1
    table = Table(title=f"fewest replicas meeting {args.slo}")
    for col in ("scheduler", "batch", "step tokens", "replicas", "goodput", "TTFT p95 ms",
                "utilisation"):
        table.add_column(col)
    for c in candidates:
        ttft = c.summary.get("ttft_p95_s")
        table.add_row(c.scheduler, str(c.max_batch_size), str(c.max_batch_tokens),
                      str(c.replicas) if c.replicas is not None else f">{args.max_replicas}",
                      f"{c.summary.get('goodput', 0):.4f}",
                      "-" if ttft is None else f"{ttft * 1000:.0f}",
                      f"{c.summary.get('utilisation', 0):.2f}")
    Console().print(table)
    auto = result.get("autoscaling")
    if auto is not None:
        Console().print(f"autoscaling target: {auto['target_waiting_per_replica']} waiting "
                        f"requests per replica (sluice_requests_waiting)")
    return 0 if best.replicas is not None else 1


def add_parser(sub: Any) -> None:
    """``plan`` on the subcommand parsers ``sub``."""
    q = sub.add_parser("plan", help="the fewest replicas and the settings that meet an SLO",
                       description="Search with the simulator for the fewest replicas (and the "
                                   "scheduler and batch settings) meeting --slo for the "
                                   "workload, and the autoscaling target per replica.")
    add_fleet_args(q)
    q.add_argument("--slo", required=True, help="e.g. ttft_p95=2s,goodput=0.99")
    q.add_argument("--schedulers", help="candidates, e.g. fifo,priority_edf (default: the "
                                        "config's)")
    q.add_argument("--batch-sizes", help="one-shot max batch candidates, e.g. 4,8,16")
    q.add_argument("--batch-tokens", help="step token budget candidates, e.g. 256,512")
    q.add_argument("--max-replicas", type=int, default=64)
    q.add_argument("--json", action="store_true")
    q.add_argument("--out", help="write the plan JSON here")
    q.add_argument("--log-level", default="warning")
    q.set_defaults(func=cmd_plan)
