"""Side-by-side LLM serving benchmark: sluice (continuous, static, serial batching) vs
llama.cpp's own llama-server, same model file, same llama.cpp version, 2 threads, 8
slots, same context size, on 127.0.0.1 — one server at a time.

Closed loop at concurrency 1, 2, 4, 8, 16 with 128 new tokens (EOS ignored), then open
loop with Poisson arrivals at 0.5, 0.8, 1.0, 1.3 × the measured capacity (sluice
continuous at concurrency 8). Reports aggregate tokens/s, TTFT and TPOT p50/p95, goodput
(TTFT ≤ 2 s and TPOT ≤ 150 ms), prints ratios sluice / llama-server, and writes
bench/results/llm_bench.json and .png.

    python bench/llm_bench.py            # full run (about 15 minutes)
    python bench/llm_bench.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.ceiling import raw_ceiling
from bench.lib.llama_server import find as find_llama_server
from bench.lib.llama_server import llama_server_cmd
from bench.lib.loadgen import closed_loop, open_loop, summarize
from bench.lib.model_tables import GEMMA, gemma_table, server_tables
from bench.lib.prompts import PROMPTS, SYSTEM_PREFIX
from bench.lib.report import GOODPUT_TITLE, TPOT_SLO_S, TTFT_SLO_S, ms, plot_open_loop
from bench.lib.servers import free_port, running, sluice_cmd
from sluice.backends.packaged import default_gguf_path

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = GEMMA
N_CTX, N_SLOTS, THREADS, MAX_TOKENS = 8192, 8, 2, 128


def sluice_toml(gguf: Path, mode: str, prefix_reuse: bool = True) -> str:
    return server_tables(MODEL, 512, 256, budget_bytes=4_000_000_000) + f"""
[engine]
mode = "{mode}"
max_batch_tokens = 512
prefill_chunk_tokens = 256
static_max_wait_ms = 50
prefix_reuse = {"true" if prefix_reuse else "false"}
""" + gemma_table(str(gguf), n_ctx=N_CTX, n_seq_max=N_SLOTS, n_threads=THREADS)


def run_phase(base_url: str, plan: dict[str, Any]) -> dict[str, Any]:
    if plan["kind"] == "closed":
        samples, wall = asyncio.run(closed_loop(
            base_url, MODEL, PROMPTS, concurrency=plan["concurrency"],
            n_requests=plan["n_requests"], max_tokens=MAX_TOKENS))
    else:
        samples, wall = asyncio.run(open_loop(
            base_url, MODEL, PROMPTS, rate_per_s=plan["rate_per_s"],
            n_requests=plan["n_requests"], max_tokens=MAX_TOKENS, seed=plan["seed"]))
    summary = summarize(samples, wall, ttft_slo_s=TTFT_SLO_S, tpot_slo_s=TPOT_SLO_S)
    return {**plan, **summary}


def measure_phase(name: str, base_url: str, plan: dict[str, Any]) -> dict[str, Any]:
    row = run_phase(base_url, plan)
    row["system"] = name
    print(f"  {name:18s} {plan['label']:>6s}: {row['tokens_per_s']:7.1f} tok/s  "
          f"ttft p50 {ms(row['ttft_p50_s'])} p95 {ms(row['ttft_p95_s'])}  "
          f"tpot p50 {ms(row['tpot_p50_s'])}  errors {row['errors']}", flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    gguf = default_gguf_path()
    server_bin = find_llama_server()
    t_start = time.time()
    ceiling = raw_ceiling(gguf)
    print(f"raw backend ceiling at batch {N_SLOTS}: {ceiling:.1f} tok/s", flush=True)

    systems: dict[str, tuple[list[str], str, str]] = {}
    for mode in ("continuous", "static", "serial"):
        port = free_port()
        cmd, _ = sluice_cmd(sluice_toml(gguf, mode), port)
        systems[f"sluice-{mode}"] = (cmd, f"http://127.0.0.1:{port}/ready",
                                     f"http://127.0.0.1:{port}")
    port = free_port()
    systems["llama-server"] = (
        llama_server_cmd(server_bin, gguf, port, n_ctx=N_CTX, n_slots=N_SLOTS,
                         threads=THREADS),
        f"http://127.0.0.1:{port}/health", f"http://127.0.0.1:{port}",
    )
    levels = [1, 8] if args.quick else [1, 2, 4, 8, 16]
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        # All servers stay up (idle ones sleep); each level runs every system back to
        # back, so slow drift of this shared host hits all of them alike.
        for name, (cmd, ready, base) in systems.items():
            stack.enter_context(running(cmd, ready, log_path=RESULTS / f"llm_bench_{name}.log"))
            asyncio.run(closed_loop(base, MODEL, PROMPTS, concurrency=1, n_requests=1,
                                    max_tokens=8))  # warm-up, not measured
        print("closed loop", flush=True)
        for c in levels:
            n = (max(2, c) if args.quick else (4 if c < 4 else 2 * c))
            for name, (_, _, base) in systems.items():
                n_sys = min(n, 8) if name == "sluice-serial" else n
                plan = {"kind": "closed", "label": f"c={c}", "concurrency": c,
                        "n_requests": n_sys}
                rows.append(measure_phase(name, base, plan))
        cap = next(r for r in rows if r["system"] == "sluice-continuous"
                   and r["concurrency"] == 8)["requests_per_s"]
        factors = [0.5, 1.3] if args.quick else [0.5, 0.8, 1.0, 1.3]
        n_open = 8 if args.quick else 20
        print(f"open loop (capacity {cap:.3f} req/s)", flush=True)
        for f in factors:
            plan = {"kind": "open", "label": f"{f}x", "load_factor": f,
                    "rate_per_s": f * cap, "n_requests": n_open, "seed": 7}
            for name in ("sluice-continuous", "sluice-static", "llama-server"):
                rows.append(measure_phase(name, systems[name][2], plan))

    print("shared system prompt: prefix reuse on vs off (sluice continuous)", flush=True)
    prefixed = [SYSTEM_PREFIX + f"Question {i}: " + p for i, p in enumerate(PROMPTS)]
    prefix_rows = []
    for reuse in (True, False):
        port = free_port()
        cmd, _ = sluice_cmd(sluice_toml(gguf, "continuous", prefix_reuse=reuse), port)
        base = f"http://127.0.0.1:{port}"
        with running(cmd, f"{base}/ready"):
            asyncio.run(closed_loop(base, MODEL, prefixed, concurrency=1, n_requests=1,
                                    max_tokens=4))
            samples, wall = asyncio.run(closed_loop(
                base, MODEL, prefixed, concurrency=4, n_requests=8 if args.quick else 16,
                max_tokens=32))
        row = {"prefix_reuse": reuse, **summarize(samples, wall, ttft_slo_s=TTFT_SLO_S,
                                                   tpot_slo_s=TPOT_SLO_S)}
        prefix_rows.append(row)
        print(f"  prefix_reuse={reuse!s:5s}: ttft p50 {ms(row['ttft_p50_s'])} "
              f"p95 {ms(row['ttft_p95_s'])}  {row['tokens_per_s']:.1f} tok/s", flush=True)
    result = {
        "benchmark": "llm_bench",
        "quick": args.quick,
        "model": f"{MODEL} (Gemma 3 270M Q4_K_M)",
        "n_ctx": N_CTX, "slots": N_SLOTS, "threads": THREADS, "max_tokens": MAX_TOKENS,
        "ttft_slo_s": TTFT_SLO_S, "tpot_slo_s": TPOT_SLO_S,
        "raw_backend_ceiling_tokens_per_s": ceiling,
        "capacity_requests_per_s": cap,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t_start)),
        "duration_s": round(time.time() - t_start, 1),
        "rows": rows,
        "ratios": ratios(rows),
        "prefix_reuse": prefix_rows,
    }
    name = "llm_bench"
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2))
    plot(result, RESULTS / f"{name}.png")
    print(json.dumps(result["ratios"], indent=2))
    return 0


def ratios(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def get(system: str, label: str, key: str) -> float | None:
        for r in rows:
            if r["system"] == system and r["label"] == label:
                return r[key]  # type: ignore[no-any-return]
        return None

    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or b in (None, 0) else round(a / b, 3)  # type: ignore[operator]

    out: dict[str, Any] = {}
    for r in rows:
        if r["system"] != "sluice-continuous":
            continue
        lab = r["label"]
        out[lab] = {
            "tokens_per_s_vs_llama_server": ratio(r["tokens_per_s"],
                                                  get("llama-server", lab, "tokens_per_s")),
            "tokens_per_s_vs_serial": ratio(r["tokens_per_s"],
                                            get("sluice-serial", lab, "tokens_per_s")),
            "tokens_per_s_vs_static": ratio(r["tokens_per_s"],
                                            get("sluice-static", lab, "tokens_per_s")),
            "ttft_p95_vs_llama_server": ratio(r["ttft_p95_s"],
                                              get("llama-server", lab, "ttft_p95_s")),
            "goodput_vs_llama_server": ratio(r["goodput_per_s"],
                                             get("llama-server", lab, "goodput_per_s")),
        }
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for system in sorted({r["system"] for r in rows}):
        closed = [r for r in rows if r["system"] == system and r["kind"] == "closed"]
        axes[0].plot([r["concurrency"] for r in closed], [r["tokens_per_s"] for r in closed],
                     marker="o", label=system)
    plot_open_loop(rows, {"ttft_p95_ms": axes[1], "goodput_per_s": axes[2]})
    axes[0].set(xscale="log", xlabel="concurrent clients", ylabel="generated tokens/s",
                title="Closed loop: aggregate throughput")
    axes[0].set_xticks([1, 2, 4, 8, 16], labels=["1", "2", "4", "8", "16"])
    axes[1].set(xlabel="offered load (× capacity)", ylabel="TTFT p95 (ms)",
                title="Open loop: TTFT p95")
    axes[2].set(xlabel="offered load (× capacity)", ylabel="requests/s meeting SLOs",
                title=GOODPUT_TITLE)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{result['model']}, {result['threads']} threads, {result['slots']} slots, "
                 f"{result['max_tokens']} new tokens")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
