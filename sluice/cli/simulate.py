"""``sluice simulate``: a workload through a simulated fleet of the config's shape
(``sluice plan`` searches for the smallest fleet that meets an objective).

    sluice simulate --config examples/synthetic.toml \\
        --workload poisson:rate=40,duration=60,model=synth-chat,prompt=10,output=16
    sluice simulate -c fleet.toml --trace recorded.jsonl --replicas 32 --json
    sluice simulate -c fleet.toml --costs costs.json --clients 32 \\
        --workload poisson:rate=1,requests=64,model=gemma-3-270m,prompt=20,output=128

``--clients N``: N closed-loop clients send the workload's requests in order, each its
next as soon as its previous one ended (arrival times not read); the report adds the
tokens the completed requests generated per second.

Costs come from the config's models (synthetic cost options, ``service_ms``,
``step_cost``) or ``--costs FILE`` (see ``sluice.sim.costs``). Prints a table per model
and tenant (``--json``: the whole report as JSON), writes ``--out`` and ``--plot``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from sluice.cli.fleet import add_fleet_args, fleet_config, workload
from sluice.sim import Arrival, Fleet, simulate, simulate_closed_loop
from sluice.sim.workload import WorkloadSpec


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
    if report.get("clients"):
        console.print(f"{report['clients']} closed-loop clients: {report['tokens']} tokens, "
                      f"{report['tokens_per_s']:.1f} tokens/s")


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
    if args.clients is not None:
        report, fleet = simulate_closed_loop(config, arrivals, clients=args.clients,
                                             ttft_slo_s=slo)
    else:
        report, fleet = simulate(config, _progress(arrivals, _expected(spec)), ttft_slo_s=slo)
    report["config"] = {"replicas": config.replicas, "workers": config.workers,
                        "scheduler": config.queue.scheduler, "router": config.queue.router,
                        "max_batch_size": config.worker.max_batch_size,
                        "workload": args.workload or args.trace, "seed": args.seed,
                        "clients": args.clients}
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    if args.plot:
        plot(fleet, report, Path(args.plot))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
    return 0


def add_parser(sub: Any) -> None:
    """``simulate`` on the subcommand parsers ``sub``."""
    p = sub.add_parser("simulate", help="run a workload through a simulated fleet",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_fleet_args(p)
    p.add_argument("--ttft-slo-ms", type=float,
                   help="count as good only requests whose TTFT is within this")
    p.add_argument("--clients", type=int,
                   help="closed loop: this many clients send the workload's requests, each "
                   "its next when its previous one ended")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--out", help="write the report JSON here")
    p.add_argument("--plot", help="write a PNG of latency CDFs and terminal states")
    p.add_argument("--log-level", default="warning")
    p.set_defaults(func=cmd_simulate)
