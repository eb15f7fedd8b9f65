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
requests within both targets.

    python bench/llm_overload.py               # 8, 16, 32, 48 clients (about 15 minutes)
    python bench/llm_overload.py --quick       # 32 and 48 clients, shorter runs

Writes bench/results/llm_overload.json and .png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from bench.lib.llama_server import LLAMA_CPP_PYTHON_VERSION, llama_server_cmd
from bench.lib.llama_server import find as find_llama_server
from bench.lib.loadgen import closed_loop, summarize
from bench.lib.model_tables import BENCH_MODELS, GEMMA
from bench.lib.prompts import PROMPTS
from bench.lib.report import TPOT_SLO_S, TTFT_SLO_S, markdown_table, ms, ratio
from bench.lib.servers import free_port, running
from bench.llm_bench import THREADS, commit, machine

RESULTS = Path(__file__).resolve().parent / "results"
SLUICE, PEER = "sluice", "llama-server"


def sluice_serve_cmd(port: int) -> list[str]:
    """``sluice serve`` as a user runs it: the packaged models, every setting its default."""
    return [sys.executable, "-m", "sluice.cli", "serve", "--port", str(port),
            "--log-level", "warning"]


def run_level(base_url: str, model: str, clients: int, n_requests: int,
              max_tokens: int) -> dict[str, Any]:
    asyncio.run(closed_loop(base_url, model, PROMPTS, concurrency=1, n_requests=1,
                            max_tokens=4))  # warm: the first step of a fresh server
    samples, wall = asyncio.run(closed_loop(base_url, model, PROMPTS, concurrency=clients,
                                            n_requests=n_requests, max_tokens=max_tokens))
    return summarize(samples, wall, ttft_slo_s=TTFT_SLO_S, tpot_slo_s=TPOT_SLO_S)


def print_row(system: str, clients: int, row: dict[str, Any]) -> None:
    print(f"  {system:12s} {clients:3d} clients: {row['tokens_per_s']:6.1f} tok/s  "
          f"ttft p50 {ms(row['ttft_p50_s'])} p95 {ms(row['ttft_p95_s'])}  "
          f"tpot p50 {ms(row['tpot_p50_s'])} p95 {ms(row['tpot_p95_s'])}  "
          f"within both {row['goodput_requests']}/{row['requests']}  errors {row['errors']}",
          flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--model", default=GEMMA, choices=sorted(BENCH_MODELS))
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    levels = (32, 48) if args.quick else (8, 16, 32, 48)
    label, locate = BENCH_MODELS[args.model]
    gguf = locate()
    binary = find_llama_server()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    rows: list[dict[str, Any]] = []
    model = args.model
    with running(sluice_serve_cmd(port), f"{base}/ready"):
        props = httpx.get(f"{base}/props", params={"model": model}, timeout=120).json()
        slots = int(props["total_slots"])
        cells = slots * int(props["default_generation_settings"]["n_ctx"])
        print(f"sluice: {model}, {slots} slots, {cells} KV cells", flush=True)
        for clients in levels:
            n = 2 * clients if args.quick else max(64, 2 * clients)
            row = {"system": SLUICE, "clients": clients,
                   **run_level(base, model, clients, n, args.max_tokens)}
            print_row(SLUICE, clients, row)
            rows.append(row)
    for clients in levels:
        port = free_port()
        peer = f"http://127.0.0.1:{port}"
        cmd = llama_server_cmd(binary, gguf, port, n_ctx=cells, n_slots=clients,
                               threads=THREADS)
        with running(cmd, f"{peer}/health"):
            n = 2 * clients if args.quick else max(64, 2 * clients)
            row = {"system": PEER, "clients": clients, "np": clients,
                   **run_level(peer, model, clients, n, args.max_tokens)}
            print_row(PEER, clients, row)
            rows.append(row)
    table = comparison(rows, levels)
    result = {"benchmark": "llm_overload", "model": args.model, "model_label": label,
              "quick": args.quick, "started": started, "commit": commit(),
              "machine": machine(), "llama_cpp_python": LLAMA_CPP_PYTHON_VERSION,
              "threads": THREADS, "sluice_slots": slots, "kv_cells": cells,
              "max_tokens": args.max_tokens,
              "targets": {"ttft_s": TTFT_SLO_S, "tpot_s": TPOT_SLO_S},
              "rows": rows, "comparison": table,
              "goals": goals(table)}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "llm_overload.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, RESULTS / "llm_overload.png")
    print(markdown_table(
        ["clients", "tok/s ratio", "TTFT p95 ratio", "TPOT p95 ratio",
         "within both (sluice / llama-server)"],
        [[str(c["clients"]), times(c["tokens_per_s_ratio"]), times(c["ttft_p95_ratio"]),
          times(c["tpot_p95_ratio"]),
          f"{c['sluice_within_both']} / {c['llama_server_within_both']}"] for c in table]))
    print(json.dumps(result["goals"], indent=2))
    return 0


def times(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def comparison(rows: list[dict[str, Any]], levels: tuple[int, ...]) -> list[dict[str, Any]]:
    def get(system: str, clients: int) -> dict[str, Any]:
        return next(r for r in rows if r["system"] == system and r["clients"] == clients)

    out = []
    for clients in levels:
        mine, peer = get(SLUICE, clients), get(PEER, clients)
        out.append({
            "clients": clients,
            "tokens_per_s_ratio": ratio(mine["tokens_per_s"], peer["tokens_per_s"]),
            "ttft_p95_ratio": ratio(mine["ttft_p95_s"], peer["ttft_p95_s"]),
            "tpot_p95_ratio": ratio(mine["tpot_p95_s"], peer["tpot_p95_s"]),
            "sluice_within_both": mine["goodput_requests"],
            "llama_server_within_both": peer["goodput_requests"],
        })
    return out


def goals(table: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's goals at 32 and 48 clients, each true or false with its figure."""
    out: dict[str, Any] = {}
    for c in (c for c in table if c["clients"] >= 32):
        out[str(c["clients"])] = {
            "tokens_per_s_at_least_1x": (c["tokens_per_s_ratio"] or 0) >= 1.0,
            "ttft_p95_within_1_5x": (c["ttft_p95_ratio"] or 99) <= 1.5,
            "tpot_p95_within_1x": (c["tpot_p95_ratio"] or 99) <= 1.0,
            "more_within_both": c["sluice_within_both"] > c["llama_server_within_both"],
        }
    return out


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
