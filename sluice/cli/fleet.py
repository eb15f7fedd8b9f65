"""The fleet flags ``sluice simulate`` and ``sluice plan`` share: the config and cost file
a simulated fleet is shaped from, the flags over them, and the workload (a generated
process or a recorded trace)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sluice.config import Config, default_config, load_config
from sluice.sim import Arrival, SimConfig, generate, parse_spec, read_trace
from sluice.sim.costs import read_costs
from sluice.sim.workload import WorkloadSpec


def add_fleet_args(p: argparse.ArgumentParser) -> None:
    """Flags shared by ``simulate`` and ``plan``."""
    p.add_argument("--config", "-c", help="the server's TOML config (default: the packaged "
                                          "model's, which needs --costs)")
    p.add_argument("--costs", help="JSON cost file, or a `sluice profile` result")
    p.add_argument("--workload", "-w", help="e.g. poisson:rate=20,duration=60,model=m")
    p.add_argument("--trace", help="JSONL arrivals to replay")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--replicas", type=int)
    p.add_argument("--workers", type=int, help="workers per replica")
    p.add_argument("--scheduler", choices=["fifo", "workload_aware", "priority_edf", "wfq"])
    p.add_argument("--router", choices=["round_robin", "least_loaded", "residency_aware"])
    p.add_argument("--replica-router", choices=["round_robin", "least_loaded", "affinity"])
    p.add_argument("--max-batch", type=int, help="one-shot dynamic batch size")
    p.add_argument("--max-batch-tokens", type=int, help="tokens per continuous-batching step")
    p.add_argument("--queue-capacity", type=int)


def fleet_config(args: argparse.Namespace) -> SimConfig:
    """The ``SimConfig`` of ``--config`` and ``--costs`` with the flags over it."""
    config: Config = load_config(args.config) if args.config else default_config()
    costs, base = None, None
    if args.costs:
        costs, base = read_costs(Path(args.costs)), Path(args.costs).parent
    sim = SimConfig.from_config(config, costs, base)
    changes: dict[str, Any] = {k: v for k, v in {
        "replicas": args.replicas, "workers": args.workers,
        "replica_router": args.replica_router,
    }.items() if v is not None}
    queue = {k: v for k, v in {
        "scheduler": args.scheduler, "router": args.router,
        "queue_capacity": args.queue_capacity,
    }.items() if v is not None}
    if queue:
        changes["queue"] = dataclasses.replace(sim.queue, **queue)
    worker = sim.worker
    if args.max_batch is not None:
        worker = dataclasses.replace(worker, max_batch_size=args.max_batch)
    if args.max_batch_tokens is not None:
        worker = dataclasses.replace(worker, engine=dataclasses.replace(
            worker.engine, max_batch_tokens=args.max_batch_tokens))
    changes["worker"] = worker
    return dataclasses.replace(sim, **changes)


def workload(args: argparse.Namespace) -> tuple[WorkloadSpec | None, Iterable[Arrival]]:
    """The workload's spec (``None`` for a trace) and its arrivals; ``ValueError`` unless
    exactly one of ``--workload`` and ``--trace`` is given."""
    if bool(args.workload) == bool(args.trace):
        raise ValueError("give one of --workload SPEC or --trace FILE")
    if args.trace:
        return None, read_trace(Path(args.trace))
    spec = parse_spec(args.workload)
    return spec, generate(spec, args.seed)
