"""Step time against batch size and KV in use: one unified KV pool (llama.cpp's
``kv_unified``) against one stream per sequence, the same ``n_ctx`` cells and slots.

For each layout, batch size B and context length L: B sequences are prefilled to L tokens,
then ``--steps`` decode steps (one token per sequence) are timed through the backend's
``forward`` (no engine, no HTTP). The faster layout at the sizes sluice serves becomes the
default (issue 15); the step samples also fit the step-time model
(``sluice.policy.step.step_cost``), which is saved as the profiled prior.

    python bench/micro/kv_layout.py   # about 2 minutes (quiet host)
    python bench/micro/kv_layout.py --quick                        # a smoke run

Writes bench/results/kv_layout.json, .png and examples/step_cost_gemma3_270m.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sluice.policy.step.step_cost import DEFAULT_STEP_COST, StepSample, fit_step_cost

RESULTS = Path(__file__).resolve().parents[1] / "results"
N_CTX, N_SLOTS, THREADS = 8192, 32, 2

_CHILD = """
import json, sys, time
from sluice.backends.base import ForwardChunk, ModelSpec
from sluice.backends.llamacpp import LlamaCppBackend
unified, batches, lengths, steps = json.loads(sys.argv[1])
spec = ModelSpec("g", "generative", "llamacpp", 1, options={
    "path": "packaged:gemma-3-270m", "n_ctx": N_CTX, "n_seq_max": N_SLOTS, "n_threads": THREADS,
    "kv_unified": unified})
m = LlamaCppBackend().load(spec)
base = m.tokenize("Once upon a time there was a lighthouse keeper who", add_bos=True)
out = []
for length in lengths:
    prompt = tuple((base * (length // len(base) + 1))[:length])
    for b in batches:
        if b * (length + steps) > m.n_ctx_total or length + steps > m.n_ctx_per_seq:
            continue
        for s in range(b):
            m.release_sequence(s)
        for s in range(b):  # prefill one sequence at a time (<= n_batch tokens each)
            m.forward([ForwardChunk(s, prompt, 0, True)])
        times = []
        for i in range(steps):
            t = time.perf_counter()
            m.forward([ForwardChunk(s, (prompt[-1],), length + i, True) for s in range(b)])
            times.append(time.perf_counter() - t)
        times.sort()
        out.append({"unified": unified, "batch": b, "context_tokens": length,
                    "kv_in_use_tokens": b * (length + steps // 2),
                    "step_ms_median": 1000 * times[len(times) // 2],
                    "step_ms_min": 1000 * times[0], "steps": steps})
        print(json.dumps(out[-1]), flush=True)
print("RESULT " + json.dumps(out))
""".replace("N_CTX", str(N_CTX)).replace("N_SLOTS", str(N_SLOTS)).replace(
    "THREADS", str(THREADS))


def measure(unified: bool, batches: list[int], lengths: list[int], steps: int
            ) -> list[dict[str, Any]]:
    """One layout in its own process (its memory is gone before the next one loads)."""
    rows: list[dict[str, Any]] = []
    with subprocess.Popen([sys.executable, "-c", _CHILD,
                           json.dumps([unified, batches, lengths, steps])],
                          stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("RESULT "):
                rows = json.loads(line[len("RESULT "):])
            else:
                print("  " + line.rstrip(), flush=True)
    if proc.returncode:
        raise RuntimeError(f"the measuring process failed ({proc.returncode})")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    batches = [1, 8] if args.quick else [1, 8, 16, 32]
    lengths = [64] if args.quick else [32, 224]
    steps = 4 if args.quick else 8
    t0 = time.time()
    rows: list[dict[str, Any]] = []
    # Interleaved: split, unified, split, unified ... one length at a time, so drift of
    # this shared host hits both layouts alike.
    for length in lengths:
        for unified in (False, True):
            rows.extend(measure(unified, batches, [length], steps))
    print(f"{'layout':8s} {'L':>5s} " + " ".join(f"B={b:<6d}" for b in batches))
    for length in lengths:
        for unified in (False, True):
            cells = {r["batch"]: r["step_ms_median"] for r in rows
                     if r["unified"] == unified and r["context_tokens"] == length}
            print(f"{'unified' if unified else 'split':8s} {length:5d} "
                  + " ".join(f"{cells.get(b, float('nan')):6.1f}ms" for b in batches))
    ratios = {}
    for r in rows:
        if r["unified"]:
            twin = next((s for s in rows if not s["unified"] and s["batch"] == r["batch"]
                         and s["context_tokens"] == r["context_tokens"]), None)
            if twin:
                key = f"B={r['batch']},L={r['context_tokens']}"
                ratios[key] = round(r["step_ms_median"] / twin["step_ms_median"], 3)
    print("unified / split step time:", json.dumps(ratios))
    faster = statistics.median(ratios.values() or [1.0]) < 1.0  # unified faster (median)
    samples = [StepSample(r["batch"], 0, r["step_ms_median"] / 1000,
                          r["batch"] * (r["context_tokens"] + r["steps"] // 2))
               for r in rows if r["unified"] == faster]
    # No prefill is varied here: its coefficient comes from the default prior.
    cost = fit_step_cost(samples, fallback=DEFAULT_STEP_COST)
    print(f"step cost fitted on the {'unified' if faster else 'split'} rows:", cost.to_json())
    result = {
        "benchmark": "kv_layout", "quick": args.quick,
        "model": "gemma-3-270m (Gemma 3 270M Q4_K_M)",
        "n_ctx": N_CTX, "slots": N_SLOTS, "threads": THREADS,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)),
        "duration_s": round(time.time() - t0, 1),
        "rows": rows, "unified_over_split": ratios, "faster_layout":
        "unified" if faster else "split", "step_cost": cost.to_json(),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "kv_layout"
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    if not args.quick:
        cost.save(RESULTS.parent.parent / "examples" / "step_cost_gemma3_270m.json")
    plot(result, RESULTS / f"{name}.png")
    return 0


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    rows = result["rows"]
    for length in sorted({r["context_tokens"] for r in rows}):
        for unified, style in ((False, "--"), (True, "-")):
            pts = sorted((r["batch"], r["step_ms_median"]) for r in rows
                         if r["unified"] == unified and r["context_tokens"] == length)
            if pts:
                ax.plot(*zip(*pts, strict=True), style, marker="o",
                        label=f"{'unified' if unified else 'split'}, {length} ctx tokens")
    ax.axhline(150, color="grey", lw=0.8, ls=":", label="150 ms TPOT target")
    ax.set(xlabel="decode batch (sequences)", ylabel="step time (ms, median)",
           title=f"KV layout: {result['n_ctx']} cells, {result['slots']} slots, "
                 f"{result['threads']} threads")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
