"""Did a change cost tokens/s? Two or more sluice builds (git commits) or configurations,
side by side on the same model, with llama-server as the fixed reference.

Question: is sluice at commit B (or with ``[workers] isolation = "process"``) as fast as
at commit A on this machine now? Figures from different runs mean little on a host that
drifts by 10 % or more between minutes; this bench keeps every side up at once (an idle
server sleeps) and alternates them in rounds (A B C, then C B A, ...), so drift hits each
side alike, and reports each side's median tokens/s over the rounds against the first
side's and against llama-server's.

A side is ``LABEL=REF[+KEY=VALUE...]``: ``REF`` is a git commit (checked out into a
temporary worktree and served from there with this Python environment) or ``.`` for this
checkout; each ``+KEY=VALUE`` is one more TOML line of the ``[workers]`` table, or of the
model's table when ``KEY`` starts with ``model.`` (``+model.speculation="off"``). The server
settings are the headline's (``bench/lib/llm_runs.py``: 8 slots over 8192 cells, 2 threads,
streamed completions of 128 new tokens, EOS ignored).

    python bench/ab.py --name core --side now=. --side before=59601b8~1 --clients 8
    python bench/ab.py --name isolation --side thread=. \\
        --side 'process=.+isolation="process"' --clients 8

writes the comparison ``--name`` into ``bench/results/ab.json`` (other names kept) and
redraws ``bench/results/ab.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.llama_server import find as find_llama_server
from bench.lib.llama_server import llama_server_cmd
from bench.lib.llm_runs import MAX_TOKENS, N_CTX, N_SLOTS, THREADS, measure, sluice_toml
from bench.lib.loadgen import closed_loop
from bench.lib.model_tables import BENCH_MODELS, GEMMA
from bench.lib.prompts import PROMPTS
from bench.lib.report import commit, machine, markdown_table, ratio
from bench.lib.servers import free_port, running, sluice_cmd

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
PEER = "llama-server"


@dataclass(frozen=True)
class Side:
    """One sluice under test: a checkout and the extra ``[workers]`` lines it runs with."""

    label: str
    ref: str
    workers_extra: tuple[str, ...]


def parse_side(text: str) -> Side:
    """``LABEL=REF[+KEY=VALUE...]`` -> a ``Side``."""
    label, sep, rest = text.partition("=")
    if not sep or not label or not rest:
        raise argparse.ArgumentTypeError(f"a side is LABEL=REF[+KEY=VALUE...]: {text!r}")
    ref, *extra = rest.split("+")
    return Side(label, ref, tuple(extra))


@contextlib.contextmanager
def checkout(ref: str) -> Iterator[Path]:
    """A directory holding ``ref``: this checkout for ``.``, else a temporary detached git
    worktree (removed afterwards) with this checkout's generated gRPC modules."""
    if ref == ".":
        yield REPO
        return
    where = Path(tempfile.mkdtemp(prefix="sluice-ab-")) / "tree"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(where),
                    ref], check=True)
    try:
        for generated in (REPO / "sluice" / "v1").glob("*_pb2*.py*"):
            target = where / "sluice" / "v1" / generated.name
            if not target.exists():
                shutil.copy2(generated, target)
        yield where
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(where)],
                       check=False)


def side_command(side: Side, tree: Path, model: str, gguf: Path, port: int) -> list[str]:
    """``sluice serve`` of ``tree`` on the headline's config plus the side's lines."""
    workers = "".join(f"{line}\n" for line in side.workers_extra
                      if not line.startswith("model."))
    models = "".join(f"{line.removeprefix('model.')}\n" for line in side.workers_extra
                     if line.startswith("model."))
    cmd, _ = sluice_cmd(sluice_toml(model, gguf, "continuous", workers_extra=workers,
                                    model_extra=models), port)
    return ["env", "--chdir", str(tree), f"PYTHONPATH={tree}", *cmd]


def summary(rows: list[dict[str, Any]], labels: Sequence[str], clients: Sequence[int]
            ) -> list[dict[str, Any]]:
    """Per client count and side: median tokens/s and TPOT p50 over the rounds, and the
    ratios to the first side and to llama-server."""
    out = []
    for c in clients:
        med: dict[str, float] = {}
        for label in [*labels, PEER]:
            mine = [r for r in rows if r["system"] == label and r["concurrency"] == c]
            if mine:
                med[label] = statistics.median(r["tokens_per_s"] for r in mine)
        for label in labels:
            mine = [r for r in rows if r["system"] == label and r["concurrency"] == c]
            out.append({
                "clients": c, "side": label,
                "tokens_per_s_median": round(med[label], 1),
                "tokens_per_s_rounds": [round(r["tokens_per_s"], 1) for r in mine],
                "tpot_p50_s_median": statistics.median(r["tpot_p50_s"] for r in mine),
                "vs_first_side": ratio(med[label], med[labels[0]]),
                "vs_llama_server": ratio(med[label], med.get(PEER)),
            })
    return out


def run(args: argparse.Namespace) -> int:
    """Measure every side and llama-server in alternating rounds; merge into the JSON."""
    label_of_model, gguf_of = BENCH_MODELS[args.model]
    gguf = gguf_of()
    sides: list[Side] = args.side
    labels = [s.label for s in sides]
    if len(set(labels)) != len(labels) or PEER in labels:
        raise SystemExit(f"side labels must be distinct and not {PEER!r}: {labels}")
    t_start = time.time()
    rows: list[dict[str, Any]] = []
    commits: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        urls: dict[str, str] = {}
        for side in sides:
            tree = stack.enter_context(checkout(side.ref))
            commits[side.label] = subprocess.run(
                ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                text=True, check=True).stdout.strip()
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            stack.enter_context(running(side_command(side, tree, args.model, gguf, port),
                                        f"{base}/ready", log_path=RESULTS / f"ab_{side.label}.log"))
            urls[side.label] = base
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        stack.enter_context(running(
            llama_server_cmd(find_llama_server(), gguf, port, n_ctx=N_CTX, n_slots=N_SLOTS,
                             threads=THREADS), f"{base}/health"))
        urls[PEER] = base
        for url in urls.values():  # warm-up, not measured
            asyncio.run(closed_loop(url, args.model, PROMPTS, concurrency=1, n_requests=1,
                                    max_tokens=8))
        order = [*labels, PEER]
        for rnd in range(args.rounds):
            for c in args.clients:
                for name in order if rnd % 2 == 0 else list(reversed(order)):
                    plan = {"kind": "closed", "label": f"c={c}", "concurrency": c,
                            "n_requests": args.requests_per_client * c, "round": rnd}
                    rows.append(measure(name, urls[name], args.model, plan))
    result = {
        "question": f"tokens/s of {', '.join(labels)} side by side (first side = 1.0)",
        "model": args.model, "model_label": label_of_model, "sides": [
            {"label": s.label, "ref": s.ref, "commit": commits[s.label],
             "workers_extra": list(s.workers_extra)} for s in sides],
        "clients": args.clients, "rounds": args.rounds, "max_tokens": MAX_TOKENS,
        "slots": N_SLOTS, "threads": THREADS, "machine": machine(), "bench_commit": commit(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t_start)),
        "duration_s": round(time.time() - t_start, 1),
        "summary": summary(rows, labels, args.clients), "rows": rows,
    }
    out: Path = args.out
    merged: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    merged.setdefault("comparisons", {})[args.name] = result
    out.write_text(json.dumps(merged, indent=2) + "\n")
    plot(merged, out.with_suffix(".png"))
    print()
    print(markdown(result))
    print(f"\nwrote comparison {args.name!r} into {out} and {out.with_suffix('.png')}")
    return 0


def markdown(result: dict[str, Any]) -> str:
    """One comparison as a table: a row per client count and side."""
    body = [[str(s["clients"]), s["side"], f"{s['tokens_per_s_median']:.1f}",
             " / ".join(f"{v:.1f}" for v in s["tokens_per_s_rounds"]),
             f"{s['vs_first_side']:.3f}×", f"{s['vs_llama_server']:.3f}×"]
            for s in result["summary"]]
    return markdown_table(["clients", "side", "tok/s (median)", "rounds", "vs first side",
                           "vs llama-server"], body)


def plot(merged: dict[str, Any], path: Path) -> None:
    """A panel per comparison: each side's median tokens/s per client count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    comps = merged["comparisons"]
    fig, axes = plt.subplots(1, len(comps), figsize=(5 * len(comps), 4), squeeze=False)
    for ax, (name, comp) in zip(axes[0], sorted(comps.items()), strict=True):
        sides = [s["label"] for s in comp["sides"]]
        width = 0.8 / len(sides)
        for i, label in enumerate(sides):
            pts = [s for s in comp["summary"] if s["side"] == label]
            ax.bar([comp["clients"].index(p["clients"]) + i * width for p in pts],
                   [p["tokens_per_s_median"] for p in pts], width, label=label)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(comp["clients"]))],
                      labels=[f"{c} clients" for c in comp["clients"]])
        ax.set(ylabel="tokens/s (median of rounds)",
               title=f"{name} ({comp['started'][:10]})")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/ab.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", required=True, help="the comparison's name in the JSON")
    parser.add_argument("--side", type=parse_side, action="append", required=True,
                        metavar="LABEL=REF[+KEY=VALUE...]", help="a sluice under test (2 or more)")
    parser.add_argument("--clients", type=lambda t: [int(x) for x in t.split(",")],
                        default=[8], metavar="N,N,...", help="closed-loop client counts")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--model", default=GEMMA, choices=sorted(BENCH_MODELS))
    parser.add_argument("--out", type=Path, default=RESULTS / "ab.json")
    args = parser.parse_args(argv)
    if len(args.side) < 2:
        parser.error("give two or more --side")
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
