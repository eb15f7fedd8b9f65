"""The headline: sluice against llama.cpp's own llama-server on the same model file, the
same llama.cpp version, the same threads, slots and context, on 127.0.0.1.

Question: how many tokens per second, and how fast a first token, does sluice give next to
the server a user would otherwise run? Both servers stay up (an idle one sleeps); each
level runs every system back to back, so drift of the host hits them alike. Every request
is a streamed ``/v1/completions`` of ``MAX_TOKENS`` new tokens (EOS ignored).

- ``--quick`` (a few minutes on 2 cores): sluice (continuous batching) and llama-server,
  closed loops at 1 and 8 concurrent clients (``--clients`` picks others; ``--open-loop``
  adds the Poisson phase for these two);
- full (about 15 minutes): also sluice's static and serial batching, closed loops at 1, 2,
  4, 8 and 16 clients, open-loop Poisson arrivals at 0.5, 0.8, 1.0 and 1.3 × the capacity
  sluice measured at 8 clients (goodput: TTFT ≤ 2 s and TPOT ≤ 150 ms), and a shared
  system prompt with prefix reuse on and off.

Prints the headline table (tokens/s, TTFT p50 and TPOT p50 of each, and the ratios
sluice / llama-server) and writes ``bench/results/llm_bench.json`` and ``.png``.

    python -m bench --quick                     # or: sluice bench --quick
    python -m bench                             # full
    python -m bench --quick --model smollm2-135m-instruct

``--model`` picks a packaged model (``bench.lib.model_tables.BENCH_MODELS``); Gemma 3 270M
is the reference the committed results use. llama-server is ``$SLUICE_LLAMA_SERVER`` or
built once (``bench/lib/llama_server.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.ceiling import raw_ceiling
from bench.lib.llama_server import LLAMA_CPP_PYTHON_VERSION, llama_server_cmd
from bench.lib.llama_server import find as find_llama_server
from bench.lib.llm_runs import MAX_TOKENS, N_CTX, N_SLOTS, THREADS, measure, sluice_toml
from bench.lib.loadgen import closed_loop, summarize
from bench.lib.model_tables import BENCH_MODELS, GEMMA
from bench.lib.prompts import PROMPTS, SYSTEM_PREFIX
from bench.lib.report import (
    GOODPUT_TITLE,
    TPOT_SLO_S,
    TTFT_SLO_S,
    commit,
    machine,
    markdown_table,
    ms,
    plot_open_loop,
    ratio,
)
from bench.lib.servers import free_port, running, sluice_cmd

RESULTS = Path(__file__).resolve().parent / "results"
PEER = "llama-server"
SLUICE = "sluice-continuous"


def headline(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per closed-loop level: sluice (continuous) and llama-server side by side, with the
    ratios sluice / llama-server."""
    def row(system: str, label: str) -> dict[str, Any] | None:
        return next((r for r in rows if r["system"] == system and r["label"] == label), None)

    out = []
    for mine in (r for r in rows if r["system"] == SLUICE and r["kind"] == "closed"):
        peer = row(PEER, mine["label"])
        if peer is None:
            continue
        out.append({
            "clients": mine["concurrency"],
            "sluice_tokens_per_s": round(mine["tokens_per_s"], 1),
            "llama_server_tokens_per_s": round(peer["tokens_per_s"], 1),
            "tokens_per_s_ratio": ratio(mine["tokens_per_s"], peer["tokens_per_s"]),
            "sluice_ttft_p50_s": mine["ttft_p50_s"], "llama_server_ttft_p50_s": peer["ttft_p50_s"],
            "ttft_p50_ratio": ratio(mine["ttft_p50_s"], peer["ttft_p50_s"]),
            "sluice_tpot_p50_s": mine["tpot_p50_s"], "llama_server_tpot_p50_s": peer["tpot_p50_s"],
            "tpot_p50_ratio": ratio(mine["tpot_p50_s"], peer["tpot_p50_s"]),
        })
    return out


def headline_markdown(result: dict[str, Any]) -> str:
    """The README's table: one row per client count."""
    def s(v: float | None) -> str:
        return "-" if v is None else f"{v * 1000:.0f} ms"

    def x(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}×"

    body = [[str(h["clients"]), f"{h['sluice_tokens_per_s']:.1f}",
             f"{h['llama_server_tokens_per_s']:.1f}", f"**{x(h['tokens_per_s_ratio'])}**",
             f"{s(h['sluice_ttft_p50_s'])} / {s(h['llama_server_ttft_p50_s'])}",
             f"{s(h['sluice_tpot_p50_s'])} / {s(h['llama_server_tpot_p50_s'])}"]
            for h in result["headline"]]
    table = markdown_table(["clients", "sluice tok/s", "llama-server tok/s", "ratio",
                            "TTFT p50 (sluice / llama-server)",
                            "TPOT p50 (sluice / llama-server)"], body)
    m = result["machine"]
    return (f"{table}\n\n{result['model_label']}, {result['threads']} threads, "
            f"{result['slots']} slots, {result['max_tokens']} new tokens a request; "
            f"`python -m bench{' --quick' if result['quick'] else ''}`, "
            f"{result['started'][:10]}, {m['cpus']} × {m['cpu']}.")


def ratios(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """sluice (continuous) against every other system, per level."""
    def get(system: str, label: str, key: str) -> float | None:
        for r in rows:
            if r["system"] == system and r["label"] == label:
                return r[key]  # type: ignore[no-any-return]
        return None

    out: dict[str, Any] = {}
    for r in rows:
        if r["system"] != SLUICE:
            continue
        lab = r["label"]
        out[lab] = {
            "tokens_per_s_vs_llama_server": ratio(r["tokens_per_s"],
                                                  get(PEER, lab, "tokens_per_s")),
            "tokens_per_s_vs_serial": ratio(r["tokens_per_s"],
                                            get("sluice-serial", lab, "tokens_per_s")),
            "tokens_per_s_vs_static": ratio(r["tokens_per_s"],
                                            get("sluice-static", lab, "tokens_per_s")),
            "ttft_p95_vs_llama_server": ratio(r["ttft_p95_s"], get(PEER, lab, "ttft_p95_s")),
            "goodput_vs_llama_server": ratio(r["goodput_per_s"],
                                             get(PEER, lab, "goodput_per_s")),
        }
    return out


def prefix_reuse_rows(model: str, gguf: Path, quick: bool) -> list[dict[str, Any]]:
    """A shared system prompt: TTFT with prefix reuse on against off (sluice continuous)."""
    print("shared system prompt: prefix reuse on vs off (sluice continuous)", flush=True)
    prefixed = [SYSTEM_PREFIX + f"Question {i}: " + p for i, p in enumerate(PROMPTS)]
    out = []
    for reuse in (True, False):
        port = free_port()
        cmd, _ = sluice_cmd(sluice_toml(model, gguf, "continuous", prefix_reuse=reuse), port)
        base = f"http://127.0.0.1:{port}"
        with running(cmd, f"{base}/ready"):
            asyncio.run(closed_loop(base, model, prefixed, concurrency=1, n_requests=1,
                                    max_tokens=4))
            samples, wall = asyncio.run(closed_loop(
                base, model, prefixed, concurrency=4, n_requests=8 if quick else 16,
                max_tokens=32))
        row = {"prefix_reuse": reuse, **summarize(samples, wall, ttft_slo_s=TTFT_SLO_S,
                                                   tpot_slo_s=TPOT_SLO_S)}
        out.append(row)
        print(f"  prefix_reuse={reuse!s:5s}: ttft p50 {ms(row['ttft_p50_s'])} "
              f"p95 {ms(row['ttft_p95_s'])}  {row['tokens_per_s']:.1f} tok/s", flush=True)
    return out


def _levels(text: str) -> list[int]:
    """``"8,32"`` -> ``[8, 32]``: positive client counts."""
    try:
        levels = [int(part) for part in text.split(",")]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a list of client counts: {text!r}") from exc
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"client counts must be >= 1: {text!r}")
    return levels


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``python -m bench`` and ``sluice bench``."""
    parser.add_argument("--quick", action="store_true",
                        help="sluice and llama-server at 1 and 8 clients only (minutes)")
    parser.add_argument("--model", default=GEMMA, choices=sorted(BENCH_MODELS),
                        help=f"the packaged model to serve (default {GEMMA}, the reference)")
    parser.add_argument("--clients", type=_levels, metavar="N,N,...",
                        help="closed-loop client counts (default 1,8 with --quick, else "
                             "1,2,4,8,16); the open loop's capacity is measured at 8")
    parser.add_argument("--open-loop", action="store_true",
                        help="with --quick: also the open-loop Poisson phase (sluice and "
                             "llama-server at 0.5-1.3x the capacity measured at 8 clients)")
    parser.add_argument("--out", type=Path, default=RESULTS / "llm_bench.json",
                        help="the JSON to write (the PNG goes beside it)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="sluice against llama.cpp's llama-server on the same model, side by side: "
                    "the README's headline table.")
    add_arguments(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Measure, print the headline table and write the JSON and PNG."""
    model = args.model
    label, gguf_of = BENCH_MODELS[model]
    gguf = gguf_of()
    server_bin = find_llama_server()
    t_start = time.time()
    ceiling = None
    if not args.quick:
        ceiling = raw_ceiling(gguf, threads=THREADS)
        print(f"bare backend loop at batch {N_SLOTS}: {ceiling:.1f} tok/s", flush=True)
    modes = ("continuous",) if args.quick else ("continuous", "static", "serial")
    systems: dict[str, tuple[list[str], str, str]] = {}
    for mode in modes:
        port = free_port()
        cmd, _ = sluice_cmd(sluice_toml(model, gguf, mode), port)
        systems[f"sluice-{mode}"] = (cmd, f"http://127.0.0.1:{port}/ready",
                                     f"http://127.0.0.1:{port}")
    port = free_port()
    systems[PEER] = (llama_server_cmd(server_bin, gguf, port, n_ctx=N_CTX, n_slots=N_SLOTS,
                                      threads=THREADS),
                     f"http://127.0.0.1:{port}/health", f"http://127.0.0.1:{port}")
    levels = args.clients or ([1, 8] if args.quick else [1, 2, 4, 8, 16])
    if (not args.quick or args.open_loop) and 8 not in levels:
        levels = sorted({*levels, 8})  # the open loop's capacity is sluice's at 8 clients
    rows: list[dict[str, Any]] = []
    cap = None
    RESULTS.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        for name, (cmd, ready, base) in systems.items():
            stack.enter_context(running(cmd, ready, log_path=RESULTS / f"llm_bench_{name}.log"))
            asyncio.run(closed_loop(base, model, PROMPTS, concurrency=1, n_requests=1,
                                    max_tokens=8))  # warm-up, not measured
        print(f"closed loop, {label}", flush=True)
        for i, c in enumerate(levels):
            n = 2 * c if c >= 4 else 4
            order = list(systems) if i % 2 == 0 else list(reversed(systems))
            for name in order:
                n_sys = min(n, 8) if name == "sluice-serial" else n
                plan = {"kind": "closed", "label": f"c={c}", "concurrency": c,
                        "n_requests": n_sys}
                rows.append(measure(name, systems[name][2], model, plan))
        if not args.quick or args.open_loop:
            cap = next(r for r in rows if r["system"] == SLUICE
                       and r["concurrency"] == 8)["requests_per_s"]
            print(f"open loop (capacity {cap:.3f} req/s)", flush=True)
            for f in (0.5, 0.8, 1.0, 1.3):
                plan = {"kind": "open", "label": f"{f}x", "load_factor": f,
                        "rate_per_s": f * cap, "n_requests": 20, "seed": 7}
                for name in (n for n in (SLUICE, "sluice-static", PEER) if n in systems):
                    rows.append(measure(name, systems[name][2], model, plan))
    result: dict[str, Any] = {
        "benchmark": "llm_bench", "quick": args.quick,
        "model": model, "model_label": label, "llama_cpp_python": LLAMA_CPP_PYTHON_VERSION,
        "n_ctx": N_CTX, "slots": N_SLOTS, "threads": THREADS, "max_tokens": MAX_TOKENS,
        "ttft_slo_s": TTFT_SLO_S, "tpot_slo_s": TPOT_SLO_S,
        "raw_backend_ceiling_tokens_per_s": ceiling, "capacity_requests_per_s": cap,
        "machine": machine(), "commit": commit(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t_start)),
        "rows": rows, "headline": headline(rows), "ratios": ratios(rows),
        "prefix_reuse": None if args.quick else prefix_reuse_rows(model, gguf, args.quick),
    }
    result["duration_s"] = round(time.time() - t_start, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    plot(result, args.out.with_suffix(".png"))
    print()
    print(headline_markdown(result))
    print(f"\nwrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    opened = any(r["kind"] == "open" for r in rows)
    fig, axes = plt.subplots(1, 4 if opened else 2, figsize=(18 if opened else 10, 4.5))
    levels = sorted({r["concurrency"] for r in rows if r["kind"] == "closed"})
    for system in sorted({r["system"] for r in rows}):
        closed = sorted((r for r in rows if r["system"] == system and r["kind"] == "closed"),
                        key=lambda r: r["concurrency"])
        x = [r["concurrency"] for r in closed]
        axes[0].plot(x, [r["tokens_per_s"] for r in closed], marker="o", label=system)
        axes[1].plot(x, [(r["ttft_p50_s"] or 0) * 1000 for r in closed], marker="o",
                     label=system)
    axes[0].set(xscale="log", xlabel="concurrent clients", ylabel="generated tokens/s",
                title="Closed loop: aggregate throughput")
    axes[1].set(xscale="log", xlabel="concurrent clients", ylabel="TTFT p50 (ms)",
                title="Closed loop: time to first token")
    for ax in axes[:2]:
        ax.set_xticks(levels, labels=[str(c) for c in levels])
    if opened:
        plot_open_loop(rows, {"ttft_p95_ms": axes[2], "goodput_per_s": axes[3]})
        axes[2].set(xlabel="offered load (× capacity)", ylabel="TTFT p95 (ms)",
                    title="Open loop: TTFT p95")
        axes[3].set(xlabel="offered load (× capacity)", ylabel="requests/s meeting SLOs",
                    title=GOODPUT_TITLE)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{result['model_label']}, {result['threads']} threads, {result['slots']} "
                 f"slots, {result['max_tokens']} new tokens ({result['started'][:10]})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    raise SystemExit(main())
