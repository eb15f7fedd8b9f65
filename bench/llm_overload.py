"""Past the SLO: many closed-loop clients on one small host, sluice as shipped against
llama-server with as many slots as clients.

Question: when more users arrive than the TPOT target admits at once, does sluice keep
them all reading (tokens/s, first tokens within a couple of seconds) as llama-server
does, and get more of them within both targets? sluice runs as ``sluice serve`` ships,
with no options, serving the packaged model (32 slots of 1024 KV cells, a 150 ms TPOT and
a 2 s first-token target, the step-time prior measured at load); the llama-server beside
it gets ``-np`` = the client count and the same KV cells in all (``-c`` = 32 × 1024), the
same GGUF file, the same llama.cpp and threads.
Each level runs both servers back to back; every request is a streamed
``/v1/completions`` of ``--max-tokens`` new tokens (EOS ignored).

Reports per level: tokens/s, TTFT p50/p95, TPOT p50/p95 and requests within both targets
(TTFT <= 2 s, TPOT <= 150 ms) for each server, and the ratios sluice / llama-server.
Goal at 32 and 48 clients: tokens/s >= 1.0x, TTFT p95 <= 1.5x, TPOT p95 <= 1.0x and more
requests within both targets (every request, where llama-server has them all); each
goal's figure and by how much it is missed.

Beside each sluice level, the simulator's prediction (``sim``; ``sim_vs_measured``: each
figure measured, predicted and the relative error): ``sluice.sim.simulate_closed_loop``
on the same default config (its planner, TPOT and first-token targets) with the cost
file of that level as ``sluice costs`` writes it (the steps the engine ran during the
level and the step-time line it had learned; ``bench.lib.simulated.point_costs``), the
mean time a request spent outside the runtime (the client's TTFT less the server's,
from sluice's JSON access log: sluice runs with ``--log-level info --log-format json``
for it, every serving setting as shipped) and the prompts' token counts from
``/tokenize``. The error is the simulator's model of the planner and the queue, given
this host's steps at that level.

    python bench/llm_overload.py                  # 8, 16, 32, 48 clients (about 15 minutes)
    python bench/llm_overload.py --quick          # 32 and 48 clients, shorter runs
    python bench/llm_overload.py --clients 32,48  # the levels to run (any of them)

Writes bench/results/llm_overload.json and .png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from bench.lib.llama_server import LLAMA_CPP_PYTHON_VERSION, llama_server_cmd
from bench.lib.llama_server import find as find_llama_server
from bench.lib.llm_runs import THREADS
from bench.lib.loadgen import Sample, closed_loop, summarize
from bench.lib.model_tables import BENCH_MODELS, GEMMA
from bench.lib.prompts import PROMPTS
from bench.lib.report import TPOT_SLO_S, TTFT_SLO_S, commit, machine, markdown_table, ms, ratio
from bench.lib.servers import free_port, running
from bench.lib.simulated import (
    PREDICTED,
    access_lines,
    beside,
    err_cell,
    front_end_summary,
    point_costs,
    predict_closed_loop,
    seen_before,
    token_counts,
)
from sluice.cli.costs import read_status
from sluice.config import default_config
from sluice.sim import Arrival

RESULTS = Path(__file__).resolve().parent / "results"
SLUICE, PEER = "sluice", "llama-server"
LEVELS = (8, 16, 32, 48)
QUICK_LEVELS = (32, 48)


def sluice_serve_cmd(port: int) -> list[str]:
    """``sluice serve`` as a user runs it: the packaged models, every setting its default
    (logging at info, as JSON: its access lines give each request's server-side TTFT)."""
    return [sys.executable, "-m", "sluice.cli", "serve", "--port", str(port),
            "--log-level", "info", "--log-format", "json"]


def run_level(base_url: str, model: str, clients: int, n_requests: int,
              max_tokens: int, tag: str | None = None
              ) -> tuple[dict[str, Any], list[Sample]]:
    """A warm request, then the closed loop: its summary and samples (in request order,
    each tagged ``<tag>-<i>``, with ``tag``)."""
    asyncio.run(closed_loop(base_url, model, PROMPTS, concurrency=1, n_requests=1,
                            max_tokens=4))  # warm: the first step of a fresh server
    samples, wall = asyncio.run(closed_loop(base_url, model, PROMPTS, concurrency=clients,
                                            n_requests=n_requests, max_tokens=max_tokens,
                                            tag=tag))
    return summarize(samples, wall, ttft_slo_s=TTFT_SLO_S, tpot_slo_s=TPOT_SLO_S), samples


def predicted(base: str, before: dict[str, Any], model: str, clients: int,
              samples: Sequence[Sample], log: Path, tag: str, counts: Sequence[int],
              max_tokens: int, first_level: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """The simulator's prediction of one sluice level (see the module docstring) and its
    inputs: the front-end time and the cost file. The simulated server has served what
    the real one had before the level (``seen_before``): the warm request's prompt on the
    first level, every prompt after it."""
    time.sleep(1.0)  # the last access lines
    front = front_end_summary(samples, access_lines(log, tag))
    costs = point_costs(before, read_status(base), model,
                        overhead_s=front["front_s"]["mean"])
    requests = [Arrival(0.0, model, prompt_tokens=counts[i % len(counts)],
                        output_tokens=max_tokens, prefix_id=i % len(counts),
                        prefix_tokens=counts[i % len(counts)])
                for i in range(len(samples))]
    warm = seen_before(requests[:1] if first_level else requests)
    sim = predict_closed_loop(default_config(), costs, model, requests, clients,
                              ttft_slo_s=TTFT_SLO_S, tpot_slo_s=TPOT_SLO_S, warm=warm)
    return sim, {"front_end": front, "costs": costs[model]}


def parse_levels(text: str) -> tuple[int, ...]:
    """``8,16,32`` → ``(8, 16, 32)``: client counts, each >= 1."""
    try:
        levels = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--clients: {text!r} is not a list of "
                                         f"integers such as 8,16,32,48") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"--clients: want client counts >= 1, got {text!r}")
    return levels


def print_row(system: str, clients: int, row: dict[str, Any]) -> None:
    print(f"  {system:12s} {clients:3d} clients: {row['tokens_per_s']:6.1f} tok/s  "
          f"ttft p50 {ms(row['ttft_p50_s'])} p95 {ms(row['ttft_p95_s'])}  "
          f"tpot p50 {ms(row['tpot_p50_s'])} p95 {ms(row['tpot_p95_s'])}  "
          f"within both {row['goodput_requests']}/{row['requests']}  errors {row['errors']}",
          flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"clients {','.join(map(str, QUICK_LEVELS))}, 2 requests a client")
    parser.add_argument("--clients", type=parse_levels, default=None,
                        help=f"client counts to run (default {','.join(map(str, LEVELS))}; "
                        f"--quick: {','.join(map(str, QUICK_LEVELS))})")
    parser.add_argument("--requests", type=int, default=None,
                        help="requests a level instead of the default (a smoke check)")
    parser.add_argument("--model", default=GEMMA, choices=sorted(BENCH_MODELS))
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--no-llama-server", action="store_true",
                        help="sluice alone (no peer, no ratios: a check of sluice's side)")
    parser.add_argument("--out", type=Path, default=RESULTS / "llm_overload.json",
                        help="the JSON to write (the PNG goes beside it)")
    args = parser.parse_args(argv)
    levels = args.clients or (QUICK_LEVELS if args.quick else LEVELS)
    label, locate = BENCH_MODELS[args.model]
    gguf = locate()
    binary = None if args.no_llama_server else find_llama_server()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    rows: list[dict[str, Any]] = []
    model = args.model
    log = RESULTS / ".llm_overload_sluice.log"
    RESULTS.mkdir(exist_ok=True)

    def n_requests(clients: int) -> int:
        return args.requests or (2 * clients if args.quick else max(64, 2 * clients))
    with running(sluice_serve_cmd(port), f"{base}/ready", log_path=log):
        props = httpx.get(f"{base}/props", params={"model": model}, timeout=120).json()
        slots = int(props["total_slots"])
        cells = slots * int(props["default_generation_settings"]["n_ctx"])
        counts = asyncio.run(token_counts(base, model, PROMPTS))
        print(f"sluice: {model}, {slots} slots, {cells} KV cells", flush=True)
        for clients in levels:
            tag = f"c{clients}"
            before = read_status(base)
            summary, samples = run_level(base, model, clients, n_requests(clients),
                                         args.max_tokens, tag)
            row = {"system": SLUICE, "clients": clients, **summary}
            sim, inputs = predicted(base, before, model, clients, samples, log, tag, counts,
                                    args.max_tokens, first_level=clients == levels[0])
            row.update(sim=sim, sim_inputs=inputs,
                       sim_vs_measured=beside(row, sim, (*PREDICTED, "goodput_requests")))
            print_row(SLUICE, clients, row)
            print_row("  simulated", clients,
                      {**sim, "errors": sim["requests"] - sim["states"].get("completed", 0)})
            rows.append(row)
    for clients in levels:
        if binary is None:
            break
        port = free_port()
        peer = f"http://127.0.0.1:{port}"
        cmd = llama_server_cmd(binary, gguf, port, n_ctx=cells, n_slots=clients,
                               threads=THREADS)
        with running(cmd, f"{peer}/health"):
            summary, _ = run_level(peer, model, clients, n_requests(clients), args.max_tokens)
            row = {"system": PEER, "clients": clients, "np": clients, **summary}
            print_row(PEER, clients, row)
            rows.append(row)
    table = comparison(rows, levels)
    result = {"benchmark": "llm_overload", "model": args.model, "model_label": label,
              "quick": args.quick, "started": started, "commit": commit(),
              "machine": machine(), "llama_cpp_python": LLAMA_CPP_PYTHON_VERSION,
              "threads": THREADS, "sluice_slots": slots, "kv_cells": cells,
              "max_tokens": args.max_tokens,
              "targets": {"ttft_s": TTFT_SLO_S, "tpot_s": TPOT_SLO_S},
              "levels": list(levels), "rows": rows, "comparison": table,
              "goals": goals(table)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    plot(result, args.out.with_suffix(".png"))
    print(markdown_table(
        ["clients", "tok/s ratio", "TTFT p95 ratio", "TPOT p95 ratio",
         "within both (sluice / llama-server)"],
        [[str(c["clients"]), times(c["tokens_per_s_ratio"]), times(c["ttft_p95_ratio"]),
          times(c["tpot_p95_ratio"]),
          f"{c['sluice_within_both']} / {c['llama_server_within_both']}"] for c in table]))
    print()
    print(sim_table(rows))
    print()
    print(goals_text(result["goals"]))
    return 0


def sim_table(rows: list[dict[str, Any]]) -> str:
    """Per sluice level: each predicted figure measured / predicted (relative error)."""
    body = []
    for r in rows:
        if r["system"] != SLUICE or "sim_vs_measured" not in r:
            continue
        c = r["sim_vs_measured"]
        body.append([str(r["clients"]), f"{r['tokens_per_s']:.1f} / "
                     + err_cell(c, "tokens_per_s"),
                     f"{ms(r['ttft_p95_s']).strip()} / " + err_cell(c, "ttft_p95_s", 1000, 0),
                     f"{ms(r['tpot_p95_s']).strip()} / " + err_cell(c, "tpot_p95_s", 1000, 0),
                     f"{r['goodput_requests']} / " + err_cell(c, "goodput_requests", 1, 0)])
    return markdown_table(["clients", "tok/s measured / simulated (err)",
                           "TTFT p95 ms measured / simulated", "TPOT p95 ms measured / simulated",
                           "within both measured / simulated"], body)


def times(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def comparison(rows: list[dict[str, Any]], levels: Sequence[int]) -> list[dict[str, Any]]:
    """Per level with both servers' rows: sluice's figures over llama-server's."""
    def get(system: str, clients: int) -> dict[str, Any] | None:
        return next((r for r in rows if r["system"] == system and r["clients"] == clients),
                    None)

    out = []
    for clients in levels:
        mine, peer = get(SLUICE, clients), get(PEER, clients)
        if mine is None or peer is None:
            continue
        out.append({
            "clients": clients,
            "tokens_per_s_ratio": ratio(mine["tokens_per_s"], peer["tokens_per_s"]),
            "ttft_p95_ratio": ratio(mine["ttft_p95_s"], peer["ttft_p95_s"]),
            "tpot_p95_ratio": ratio(mine["tpot_p95_s"], peer["tpot_p95_s"]),
            "requests": mine["requests"],
            "sluice_within_both": mine["goodput_requests"],
            "llama_server_within_both": peer["goodput_requests"],
        })
    return out


GOALS = (("tokens_per_s_at_least_1x", "tokens_per_s_ratio", ">=", 1.0),
         ("ttft_p95_within_1_5x", "ttft_p95_ratio", "<=", 1.5),
         ("tpot_p95_within_1x", "tpot_p95_ratio", "<=", 1.0))
"""The issue's ratio goals at 32 and 48 clients: name, comparison key, sense, bound."""


def goals(table: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's goals at 32 and 48 clients (the levels run among them), each with its
    figure, whether it is met and, when not, by how much it is missed (``missed_by``:
    the ratio's distance from its bound; requests short of one more than llama-server's,
    or of every request when llama-server has them all: none can be more)."""
    out: dict[str, Any] = {}
    for c in (c for c in table if c["clients"] >= 32):
        level: dict[str, Any] = {}
        for name, key, sense, bound in GOALS:
            v = c[key]
            met = v is not None and (v >= bound if sense == ">=" else v <= bound)
            level[name] = {"value": v, "bound": bound, "met": met,
                           "missed_by": None if met or v is None
                           else round(abs(v - bound), 3)}
        mine, peer = c["sluice_within_both"], c["llama_server_within_both"]
        most = min(peer + 1, c["requests"])
        level["more_within_both"] = {"value": mine, "bound": most, "met": mine >= most,
                                     "missed_by": None if mine >= most else most - mine}
        out[str(c["clients"])] = level
    return out


def goals_text(goals_: dict[str, Any]) -> str:
    """One line a goal: met, or missed and by how much."""
    lines = []
    for clients, level in goals_.items():
        for name, g in level.items():
            state = "met" if g["met"] else (
                "no figure" if g["missed_by"] is None else f"MISSED by {g['missed_by']}")
            lines.append(f"  {clients} clients, {name}: {g['value']} (bound {g['bound']}) "
                         f"{state}")
    return "goals at 32 and 48 clients:\n" + ("\n".join(lines) or "  (no such level run)")


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(14, 3.5))
    panels = (("tokens_per_s", "tokens/s", 1.0), ("ttft_p95_s", "TTFT p95 (s)", 1.0),
              ("tpot_p95_s", "TPOT p95 (ms)", 1000.0),
              ("goodput_requests", "requests within both targets", 1.0))
    for ax, (key, title, scale) in zip(axes, panels, strict=True):
        for system, color in ((SLUICE, "#4c72b0"), (PEER, "#dd8452")):
            mine = [r for r in result["rows"] if r["system"] == system]
            ax.plot([r["clients"] for r in mine], [(r[key] or 0) * scale for r in mine],
                    marker="o", color=color, label=system)
        ax.set_title(title)
        ax.set_xlabel("closed-loop clients")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{result['model_label']}: sluice as shipped vs llama-server -np = clients "
                 f"({result['kv_cells']} KV cells each)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
