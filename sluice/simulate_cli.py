"""``sluice simulate`` and ``sluice plan``: a workload through a simulated fleet of the
config's shape, and the smallest fleet that meets an objective (``sluice.sim.plan``).

    sluice simulate --config examples/synthetic.toml \\
        --workload poisson:rate=40,duration=60,model=synth-chat,prompt=10,output=16
    sluice simulate -c fleet.toml --trace recorded.jsonl --replicas 32 --json

Costs come from the config's models (synthetic cost options, ``service_ms``,
``step_cost``) or ``--costs FILE`` (see ``sluice.sim.costs``). Prints a table per model
and tenant (``--json``: the whole report as JSON), writes ``--out`` and ``--plot``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from sluice.config import Config, default_config, load_config
from sluice.sim import Arrival, Fleet, SimConfig, generate, parse_spec, read_trace, simulate
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
        "replicas": args.replicas, "workers": args.workers, "scheduler": args.scheduler,
        "router": args.router, "replica_router": args.replica_router,
        "max_batch_size": args.max_batch, "queue_capacity": args.queue_capacity,
    }.items() if v is not None}
    if args.max_batch_tokens is not None:
        changes["engine"] = dataclasses.replace(sim.engine,
                                                max_batch_tokens=args.max_batch_tokens)
    return dataclasses.replace(sim, **changes)


def workload(args: argparse.Namespace) -> tuple[WorkloadSpec | None, Iterable[Arrival]]:
    if bool(args.workload) == bool(args.trace):
        raise ValueError("give one of --workload SPEC or --trace FILE")
    if args.trace:
        return None, read_trace(Path(args.trace))
    spec = parse_spec(args.workload)
    return spec, generate(spec, args.seed)


def _expected(spec: WorkloadSpec | None) -> int | None:
    if spec is None:
        return None
    by_time = spec.mean_rate_per_s * spec.duration_s
    return int(min(by_time, spec.requests if spec.requests is not None else by_time))


def _progress(arrivals: Iterable[Arrival], total: int | None) -> Iterator[Arrival]:
    """Arrivals, with a progress bar on stderr for long runs."""
    if total is None or total < 100_000 or not sys.stderr.isatty():
        yield from arrivals
        return
    from rich.progress import Progress

    with Progress(transient=True) as bar:
        task = bar.add_task("simulating", total=total)
        for i, a in enumerate(arrivals, 1):
            if i % 5000 == 0:
                bar.update(task, completed=i)
            yield a


def print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    def ms(d: dict[str, Any], key: str) -> str:
        v = d.get(key)
        return "-" if v is None else f"{v * 1000:.1f}"

    console = Console()
    for title, rows in (("model", report["models"]), ("tenant", report["tenants"])):
        t = Table(title=f"per {title}")
        for col in (title, "offered", "goodput", "TTFT p50/p95/p99 ms", "TPOT p50/p95 ms",
                    "e2e p50/p95/p99 ms", "states"):
            t.add_column(col)
        for name, s in rows.items():
            tt, tp, e2e = s["ttft_s"], s["tpot_s"], s["e2e_s"]
            t.add_row(name, str(s["offered"]), f"{s['goodput']:.3f}",
                      f"{ms(tt, 'p50')}/{ms(tt, 'p95')}/{ms(tt, 'p99')}",
                      f"{ms(tp, 'p50')}/{ms(tp, 'p95')}",
                      f"{ms(e2e, 'p50')}/{ms(e2e, 'p95')}/{ms(e2e, 'p99')}",
                      " ".join(f"{k}={v}" for k, v in s["states"].items()))
        console.print(t)
    console.print(f"requests {report['requests']} over {report['arrival_span_s']:.1f} s "
                  f"({report['offered_per_s']:.1f}/s); goodput "
                  f"{report['overall']['goodput']:.4f}; utilisation "
                  f"{report['utilisation']:.3f}; rejections {report['rejections'] or 'none'}"
                  + (f"; variants {report['variant_mix']}" if report["variant_mix"] else "")
                  + f"; {report['events']} events in {report['wall_s']:.2f} s")


def plot(fleet: Fleet, report: dict[str, Any], path: Path) -> None:
    """Latency CDFs per model (TTFT and end-to-end) and the terminal states."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for name, s in fleet.recorder.models.items():
        for label, values, style in (("TTFT", s.ttft, "-"), ("e2e", s.e2e, "--")):
            if len(values):
                data = np.sort(np.frombuffer(values, dtype=np.float64)) * 1000
                ax1.plot(data, np.linspace(0, 1, len(data)), style, label=f"{name} {label}")
    ax1.set_xscale("log")
    ax1.set_xlabel("ms from arrival")
    ax1.set_ylabel("fraction of completed requests")
    ax1.legend(fontsize=7)
    states = report["overall"]["states"]
    ax2.bar(list(states), list(states.values()))
    ax2.set_title(f"terminal states (goodput {report['overall']['goodput']:.3f})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cmd_simulate(args: argparse.Namespace) -> int:
    config = fleet_config(args)
    spec, arrivals = workload(args)
    slo = None if args.ttft_slo_ms is None else args.ttft_slo_ms / 1000.0
    report, fleet = simulate(config, _progress(arrivals, _expected(spec)), ttft_slo_s=slo)
    report["config"] = {"replicas": config.replicas, "workers": config.workers,
                        "scheduler": config.scheduler, "router": config.router,
                        "max_batch_size": config.max_batch_size,
                        "workload": args.workload or args.trace, "seed": args.seed}
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    if args.plot:
        plot(fleet, report, Path(args.plot))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from sluice.sim.plan import parse_slo, plan, waiting_target

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
        shaped = dataclasses.replace(config, scheduler=best.scheduler,
                                     max_batch_size=best.max_batch_size,
                                     engine=dataclasses.replace(
                                         config.engine, max_batch_tokens=best.max_batch_tokens))
        result["autoscaling"] = waiting_target(shaped, spec, best.replicas, slo.ttft_p95_s,
                                               seed=args.seed)
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
    p = sub.add_parser("simulate", help="run a workload through a simulated fleet",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_fleet_args(p)
    p.add_argument("--ttft-slo-ms", type=float,
                   help="count as good only requests whose TTFT is within this")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--out", help="write the report JSON here")
    p.add_argument("--plot", help="write a PNG of latency CDFs and terminal states")
    p.add_argument("--log-level", default="warning")
    p.set_defaults(func=cmd_simulate)
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
