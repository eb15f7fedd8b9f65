"""The LLM lane under load (issue 15): sluice with a TPOT target and first-token deadlines
against llama.cpp's llama-server at -np 8 / 16 / 32, the same model file, the same KV
memory (32768 cells), 2 threads each, 128 new tokens (EOS ignored), on 127.0.0.1. sluice runs
as a plain ``sluice serve`` (no config, no flag): its defaults must do it.

The run is split into parts, each a few minutes long and run alone on the host; each part
merges its rows into bench/results/llm_slo.json, and ``--report`` prints the table, the
ratios against the issue's targets and writes the PNG.

    python bench/llm_slo.py --part closed   # ceilings, closed loop
    python bench/llm_slo.py --part open-a   # 0.5, 0.8, 1.0 x cap
    python bench/llm_slo.py --part open-b   # 1.3, 2.0 x capacity
    python bench/llm_slo.py --report

Longer points (``--seconds 60``): one 128-token request takes 10-20 s here, so 15 s of
arrivals ends before a queue can form (at 1.3x, -np 32 simply holds the whole window's 30
arrivals at once). With ``--seconds S`` (S != 15) the open parts write their rows to
bench/results/llm_slo_open{S}s.json instead (the capacity is llm_slo.json's), each point
bounded at S + ``DRAIN_S`` seconds (requests still open then are cut: closed, counted as
misses) and summarized twice: all arrivals, and those after the first ``WARMUP_S`` s
(``steady_*``: the system with its queue formed).

    python bench/llm_slo.py --part open-b --seconds 60 \
        --levels 2.0 --peers 16,32
    python bench/llm_slo.py --report --seconds 60

Capacity is the peer's: llama-server -np 32's closed-loop request rate at 32 clients.
Goodput counts requests with TTFT <= 2 s and TPOT <= 150 ms; a refused request is a miss.
Open-loop levels run the systems back to back (interleaved), so drift of this shared host
hits all of them alike.
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
from bench.lib.loadgen import CUT_ERROR, Sample, closed_loop, open_loop, summarize
from bench.lib.model_tables import GEMMA as MODEL
from bench.lib.prompts import PROMPTS
from bench.lib.report import GOODPUT_TITLE, TPOT_SLO_S, TTFT_SLO_S, plot_open_loop
from bench.lib.servers import free_port, process_cpu_s, running
from sluice.backends.packaged import gemma_gguf_path

RESULTS = Path(__file__).resolve().parent / "results"
OUT = RESULTS / "llm_slo.json"
N_CTX, THREADS, MAX_TOKENS = 32768, 2, 128
"""KV cells of every system: sluice's default (32 slots x 1024), given to llama-server too."""
ANSWER_SLACK_S = 0.25
"""How late past the TTFT deadline an answer (token or refusal) may come and still count as
"answered in time": HTTP, tokenization and the load generator share the 2 cores."""
DEADLINE_HEADER = {"x-sluice-ttft-deadline-ms": f"{TTFT_SLO_S * 1000:g}"}
"""Open-loop clients state their first-token deadline (llama-server ignores the header).
Closed-loop clients state none: they send again the moment an answer ends, so a refusal
would only make them spin."""
PEER_SLOTS = (8, 16, 32)
LEVELS = {"open-a": (0.5, 0.8, 1.0), "open-b": (1.3, 2.0)}
OPEN_SECONDS = 15.0
"""Arrivals span about this long at each level (at least 12 requests); ``--seconds``."""
DRAIN_S = 90.0
"""A point with ``--seconds`` ends at most this long after its arrivals' span."""
WARMUP_S = 20.0
"""``steady_*`` summaries count the arrivals after this many seconds of a point."""


def results_path(seconds: float) -> Path:
    """The JSON a run with ``seconds`` of arrivals per point merges its rows into."""
    return OUT if seconds == OPEN_SECONDS else RESULTS / f"llm_slo_open{seconds:g}s.json"


def sluice_plain_cmd(port: int) -> list[str]:
    """sluice as a new user runs it: ``sluice serve`` with no config file and no flag but
    the port (the packaged model's defaults: a 150 ms TPOT target over 32 slots of 1024
    KV cells, the step-time model learned online from a rough prior;
    ``sluice.config.default_config``)."""
    return [sys.executable, "-m", "sluice.cli", "serve", "--port", str(port),
            "--log-level", "warning"]


def systems(gguf: Path, server_bin: Path, peers: tuple[int, ...]
            ) -> dict[str, tuple[list[str], str, str]]:
    """name → (command, readiness URL, base URL)."""
    out: dict[str, tuple[list[str], str, str]] = {}
    port = free_port()
    out["sluice"] = (sluice_plain_cmd(port), f"http://127.0.0.1:{port}/ready",
                     f"http://127.0.0.1:{port}")
    for np_ in peers:
        port = free_port()
        out[f"llama-server-np{np_}"] = (
            llama_server_cmd(server_bin, gguf, port, n_ctx=N_CTX, n_slots=np_, threads=THREADS),
            f"http://127.0.0.1:{port}/health", f"http://127.0.0.1:{port}")
    return out


def summary(name: str, plan: dict[str, Any], samples: list[Sample], wall_s: float
            ) -> dict[str, Any]:
    row = {**plan, "system": name,
           **summarize(samples, wall_s, ttft_slo_s=TTFT_SLO_S, tpot_slo_s=TPOT_SLO_S)}
    row["rejected"] = sum(1 for s in samples if s.status in (429, 503))
    # An answer is a first token or a refusal; a request is "answered late" when neither
    # came within the TTFT deadline (plus slack).
    row["answered_late"] = sum(
        1 for s in samples
        if (s.ttft_s if s.ttft_s is not None else s.latency_s) > TTFT_SLO_S + ANSWER_SLACK_S)
    row["goodput_share"] = row["goodput_requests"] / max(1, row["requests"])
    row["cut"] = sum(1 for s in samples if s.error == CUT_ERROR)
    if samples:
        t0 = min(s.start_s for s in samples)
        steady = [s for s in samples if s.start_s - t0 >= WARMUP_S]
        if steady:
            st = summarize(steady, wall_s, ttft_slo_s=TTFT_SLO_S, tpot_slo_s=TPOT_SLO_S)
            row.update({"steady_requests": st["requests"],
                        "steady_goodput_requests": st["goodput_requests"],
                        "steady_goodput_share": st["goodput_requests"] / st["requests"],
                        "steady_ttft_p95_s": st["ttft_p95_s"],
                        "steady_tpot_p95_s": st["tpot_p95_s"],
                        "steady_rejected": sum(1 for s in steady if s.status in (429, 503))})
    print(f"  {name:20s} {plan['label']:>8s}: {row['tokens_per_s']:6.1f} tok/s  "
          f"goodput {row['goodput_requests']:3d}/{row['requests']:<3d} "
          f"({row['goodput_per_s']:.2f}/s)  ttft p95 {_ms(row['ttft_p95_s'])}  "
          f"tpot p95 {_ms(row['tpot_p95_s'])}  rejected {row['rejected']}  "
          f"late {row['answered_late']}  cut {row['cut']}", flush=True)
    if "steady_requests" in row:
        print(f"  {'':20s} {'steady':>8s}: goodput {row['steady_goodput_requests']:3d}/"
              f"{row['steady_requests']:<3d}  ttft p95 {_ms(row['steady_ttft_p95_s'])}  "
              f"tpot p95 {_ms(row['steady_tpot_p95_s'])}  rejected {row['steady_rejected']}",
              flush=True)
    return row


def _ms(v: float | None) -> str:
    return "   -  " if v is None else f"{v * 1000:5.0f}ms"


def wait_idle(pid: int, timeout_s: float = 180.0) -> float:
    """Wait until process ``pid`` stops using CPU (a server still generating for requests
    its clients have finished with would otherwise run beside the next system); returns
    the seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        before = process_cpu_s(pid)
        time.sleep(0.5)
        if process_cpu_s(pid) - before < 0.05:
            break
    return time.monotonic() - t0


def load(path: Path = OUT) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {"rows": [], "ceilings": {}}


def save(result: dict[str, Any], path: Path = OUT) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")


def part_closed(gguf: Path, server_bin: Path, quick: bool) -> None:
    result = load()
    for batch in (8, 32):
        tok_s = raw_ceiling(gguf, batch=batch, steps=16 if quick else 48, n_ctx=N_CTX)
        result["ceilings"][str(batch)] = tok_s
        print(f"bare backend ceiling at batch {batch}: {tok_s:.1f} tok/s", flush=True)
    rows = [r for r in result["rows"] if r["kind"] != "closed"]
    with contextlib.ExitStack() as stack:
        servers = systems(gguf, server_bin, (8, 32))
        for name, (cmd, ready, base) in servers.items():
            stack.enter_context(running(cmd, ready, log_path=RESULTS / f"llm_slo_{name}.log"))
            asyncio.run(closed_loop(base, MODEL, PROMPTS, concurrency=1, n_requests=1,
                                    max_tokens=8))  # warm-up, not measured
        for clients in (8, 32):
            plan = {"kind": "closed", "label": f"c={clients}", "concurrency": clients,
                    "n_requests": clients * (1 if quick else 2)}
            for name, (_, _, base) in servers.items():
                samples, wall = asyncio.run(closed_loop(
                    base, MODEL, PROMPTS, concurrency=clients, n_requests=plan["n_requests"],
                    max_tokens=MAX_TOKENS))
                rows.append(summary(name, plan, samples, wall))
    peer = next(r for r in rows if r["kind"] == "closed" and r["concurrency"] == 32
                and r["system"] == "llama-server-np32")
    # the open-loop rows were offered load against the capacity measured first: a rerun of
    # this part records its own measurement beside it rather than moving their levels
    result["np32_c32_requests_per_s"] = peer["requests_per_s"]
    result.setdefault("capacity_requests_per_s", peer["requests_per_s"])
    result["rows"] = rows
    save(result)


def part_open(gguf: Path, server_bin: Path, levels: tuple[float, ...], quick: bool,
              only: set[str] | None = None, seconds: float = OPEN_SECONDS,
              peers: tuple[int, ...] = PEER_SLOTS) -> None:
    """Open-loop levels; ``only`` reruns those systems (their rows are replaced)."""
    path = results_path(seconds)
    result = load(path)
    cap = load().get("capacity_requests_per_s")
    if not cap:
        raise SystemExit("run --part closed first (it measures the capacity)")
    result["capacity_requests_per_s"] = cap
    result["open_seconds"] = seconds
    max_wall_s = None if seconds == OPEN_SECONDS else seconds + DRAIN_S
    print(f"open loop, capacity {cap:.3f} req/s", flush=True)
    rows = [r for r in result["rows"]
            if not (r["kind"] == "open" and r["load_factor"] in levels
                    and (only is None or r["system"] in only))]
    with contextlib.ExitStack() as stack:
        servers = systems(gguf, server_bin, peers)
        if only is not None:
            servers = {k: v for k, v in servers.items() if k in only}
        pids: dict[str, int] = {}
        for name, (cmd, ready, base) in servers.items():
            proc = stack.enter_context(running(cmd, ready,
                                               log_path=RESULTS / f"llm_slo_{name}.log"))
            pids[name] = proc.pid
            asyncio.run(closed_loop(base, MODEL, PROMPTS, concurrency=1, n_requests=1,
                                    max_tokens=8))
        for factor in levels:
            rate = factor * cap
            n = 8 if quick else max(12, round(rate * seconds))
            plan = {"kind": "open", "label": f"{factor}x", "load_factor": factor,
                    "rate_per_s": rate, "n_requests": n, "seed": 7,
                    "max_wall_s": max_wall_s}
            for name, (_, _, base) in servers.items():
                samples, wall = asyncio.run(open_loop(base, MODEL, PROMPTS, rate_per_s=rate,
                                                      n_requests=n, max_tokens=MAX_TOKENS,
                                                      seed=7, headers=DEADLINE_HEADER,
                                                      max_wall_s=max_wall_s))
                row = summary(name, plan, samples, wall)
                row["busy_after_s"] = round(wait_idle(pids[name]), 1)
                rows.append(row)
    result["rows"] = rows
    save(result, path)


def report(path: Path = OUT) -> dict[str, Any]:
    """Ratios against the issue's targets, from the merged rows."""
    result = load(path)
    rows = result["rows"]

    def row(system: str, label: str) -> dict[str, Any] | None:
        return next((r for r in rows if r["system"] == system and r["label"] == label), None)

    def best_peer(label: str, key: str) -> dict[str, Any] | None:
        peers = [r for r in rows if r["label"] == label and r["system"].startswith("llama")]
        return max(peers, key=lambda r: r[key] or 0.0, default=None)

    out: dict[str, Any] = {}
    s08, p08 = row("sluice", "0.8x"), best_peer("0.8x", "goodput_per_s")
    if s08 and p08 and s08["ttft_p95_s"] and p08["ttft_p95_s"]:
        out["ttft_p95_at_0.8x_vs_best_peer"] = {
            "ratio": round(s08["ttft_p95_s"] / p08["ttft_p95_s"], 3), "target": "<= 0.5",
            "peer": p08["system"], "sluice_tpot_p95_s": s08["tpot_p95_s"]}
        fastest = min((r for r in rows if r["label"] == "0.8x"
                       and r["system"].startswith("llama") and r["ttft_p95_s"]),
                      key=lambda r: r["ttft_p95_s"])
        # the best peer by goodput may not be the one with the lowest TTFT: say both
        out["ttft_p95_at_0.8x_vs_lowest_peer"] = {
            "ratio": round(s08["ttft_p95_s"] / fastest["ttft_p95_s"], 3), "target": "<= 0.5",
            "peer": fastest["system"]}
    for label in ("1.3x", "2.0x"):
        s, p = row("sluice", label), best_peer(label, "goodput_per_s")
        if s and p:
            out[f"goodput_at_{label}_vs_best_peer"] = {
                "ratio": round(s["goodput_per_s"] / p["goodput_per_s"], 3)
                if p["goodput_per_s"] else None, "target": ">= 1.5", "peer": p["system"],
                # per request offered, not per second of each system's own wall time (a
                # system that drains a long queue has a longer wall): the same arrivals
                "share_ratio": round(s["goodput_share"] / p["goodput_share"], 3)
                if p["goodput_share"] else None}
    ceilings = result.get("ceilings", {})
    for clients in (8, 32):
        s = row("sluice", f"c={clients}")
        if s and str(clients) in ceilings:
            out[f"closed_c{clients}_vs_bare_ceiling"] = {
                "ratio": round(s["tokens_per_s"] / ceilings[str(clients)], 3),
                "target": ">= 0.95" if clients == 8 else "(0.95 would be 1.2x the peer)"}
    s, p = row("sluice", "c=32"), row("llama-server-np32", "c=32")
    if s and p:
        out["closed_c32_vs_llama_server_np32"] = {
            "ratio": round(s["tokens_per_s"] / p["tokens_per_s"], 3), "target": ">= 1.1"}
    # only open-loop clients state a first-token deadline
    out["sluice_answered_late"] = sum(r["answered_late"] for r in rows
                                      if r["system"] == "sluice" and r["kind"] == "open")
    for label in ("0.8x", "1.3x", "2.0x"):
        # with the queue formed (points run with --seconds): the same ratios past warm-up
        s = row("sluice", label)
        if s is None or "steady_requests" not in s:
            continue
        peers = [r for r in rows if r["label"] == label and r["system"].startswith("llama")]
        best = max(peers, key=lambda r: r["steady_goodput_share"], default=None)
        if best is None:
            continue
        entry: dict[str, Any] = {"peer": best["system"],
                                 "sluice_share": round(s["steady_goodput_share"], 3),
                                 "peer_share": round(best["steady_goodput_share"], 3)}
        if best["steady_goodput_share"]:
            entry["goodput_ratio"] = round(
                s["steady_goodput_share"] / best["steady_goodput_share"], 3)
        if s["steady_ttft_p95_s"] and best["steady_ttft_p95_s"]:
            entry["ttft_p95_ratio"] = round(s["steady_ttft_p95_s"] / best["steady_ttft_p95_s"],
                                            3)
        out[f"steady_{label}_vs_best_peer"] = entry
    result["targets"] = out
    result.update({
        "benchmark": "llm_slo", "model": f"{MODEL} (Gemma 3 270M Q4_K_M)", "n_ctx": N_CTX,
        "threads": THREADS, "max_tokens": MAX_TOKENS, "ttft_slo_s": TTFT_SLO_S,
        "tpot_slo_s": TPOT_SLO_S,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "reported": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    })
    save(result, path)
    print(json.dumps(out, indent=2))
    plot(result, path.with_suffix(".png"))
    return result


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.5))
    plot_open_loop(rows, {"goodput_per_s": axes[0], "ttft_p95_ms": axes[1],
                          "rejected": axes[2]})
    if any(r["kind"] == "closed" for r in rows):
        plot_closed(result, axes[3])
    else:  # a --seconds run: its points past warm-up instead
        plot_open_loop(rows, {"steady_goodput_share": axes[3]})
        axes[3].set(xlabel="offered load (x capacity)", ylim=(0, 1.05),
                    ylabel=f"share of arrivals after {WARMUP_S:g} s meeting both SLOs",
                    title="With the queue formed")
        axes[3].grid(alpha=0.3)
        axes[3].legend(fontsize=7)
    axes[0].set(xlabel="offered load (x capacity)", ylabel="requests/s meeting both SLOs",
                title=GOODPUT_TITLE)
    axes[1].set(xlabel="offered load (x capacity)", ylabel="TTFT p95 of the served (ms)",
                title="TTFT p95", yscale="log")
    axes[2].set(xlabel="offered load (x capacity)", ylabel="requests refused",
                title="Refused at once (503)")
    for ax in axes[:3]:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    seconds = result.get("open_seconds", OPEN_SECONDS)
    fig.suptitle(f"{result['model']}, {result['threads']} threads, {result['n_ctx']} KV cells, "
                 f"{result['max_tokens']} new tokens, open-loop points of {seconds:g} s")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def plot_closed(result: dict[str, Any], ax: Any) -> None:
    """Closed-loop tokens/s, a bar per system and client count, the bare ceilings as lines."""
    rows = result["rows"]
    for system in sorted({r["system"] for r in rows}):
        closed = [r for r in rows if r["system"] == system and r["kind"] == "closed"]
        if closed:
            ax.bar([f"{system.replace('llama-server-', 'ls ')}\n{r['label']}"
                    for r in closed], [r["tokens_per_s"] for r in closed])
    for b, v in result.get("ceilings", {}).items():
        ax.axhline(v, ls=":", color="grey")
        ax.text(0, v, f" bare batch {b}", fontsize=7, va="bottom")
    ax.set(ylabel="generated tokens/s", title="Closed loop")
    ax.tick_params(axis="x", labelsize=6)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", choices=["closed", "open-a", "open-b"])
    parser.add_argument("--report", action="store_true")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--levels", help="open parts: these load factors (e.g. 2.0)")
    parser.add_argument("--only", help="open parts: rerun only these systems (comma list)")
    parser.add_argument("--seconds", type=float, default=OPEN_SECONDS,
                        help="open parts: seconds of arrivals a point (see the module)")
    parser.add_argument("--peers", default=",".join(map(str, PEER_SLOTS)),
                        help="open parts: llama-server -np values (comma list)")
    args = parser.parse_args()
    if args.part:
        gguf = gemma_gguf_path()
        server_bin = find_llama_server()
        t0 = time.time()
        if args.part == "closed":
            part_closed(gguf, server_bin, args.quick)
        else:
            levels = (tuple(float(x) for x in args.levels.split(",")) if args.levels
                      else LEVELS[args.part])
            only = set(args.only.split(",")) if args.only else None
            part_open(gguf, server_bin, levels, args.quick, only, args.seconds,
                      tuple(int(x) for x in args.peers.split(",")))
        print(f"part {args.part}: {time.time() - t0:.0f} s", flush=True)
    if args.report:
        report(results_path(args.seconds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
