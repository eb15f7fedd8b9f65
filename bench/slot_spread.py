"""Decode step time against where a batch sits in the sequence slots: the same number of
sequences on the lowest slots, or spread up to the last one, on one stream per slot.

llama.cpp's split KV keeps one stream per sequence slot; a decode step over sequences on
slots spread across many streams measured up to 3× slower than the same batch on the
lowest slots (issue 15, 9cc2a58). This is why the engine hands out free slots lowest
first and the packaged default retains only a few idle prompts. Each case: the sequences
are prefilled with one short prompt, then ``--steps`` one-token decode steps are timed
through the backend's ``forward`` (no engine, no HTTP), ``--repeats`` times.

    python bench/slot_spread.py            # run it alone on the machine; about 1 minute

Writes bench/results/slot_spread.json and .png.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sluice.backends.base import ForwardChunk, ModelSpec
from sluice.backends.llamacpp import LlamaCppBackend
from sluice.backends.packaged import default_gguf_path

RESULTS = Path(__file__).resolve().parent / "results"
N_CTX, N_SLOTS, THREADS = 32768, 32, 2
CASES: dict[str, list[int]] = {
    "compact 12": list(range(12)),
    "spread 12": [0, 2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 31],
    "compact 20": list(range(20)),
    "spread 20": sorted(set(range(0, 32, 2)) | {25, 27, 29, 31}),
    "compact 32": list(range(32)),
}
"""Case name -> the slots its sequences occupy (the packaged default: 32 slots)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS / "slot_spread.json")
    args = parser.parse_args()
    spec = ModelSpec("gemma", "generative", "llamacpp", 1, options={
        "path": str(default_gguf_path()), "n_ctx": N_CTX, "n_seq_max": N_SLOTS,
        "n_threads": THREADS})
    model = LlamaCppBackend().load(spec)
    prompt = tuple(model.tokenize("Once upon a time there was a", add_bos=True))

    def step_ms(slots: list[int]) -> float:
        for slot in range(N_SLOTS):
            model.release_sequence(slot)
        model.forward([ForwardChunk(s, prompt, 0, True) for s in slots])
        start = time.perf_counter()
        for i in range(args.steps):
            model.forward([ForwardChunk(s, (prompt[-1],), len(prompt) + i, True)
                           for s in slots])
        return (time.perf_counter() - start) / args.steps * 1000

    runs: dict[str, list[float]] = {name: [] for name in CASES}
    for rep in range(args.repeats):
        for name, slots in CASES.items():  # interleaved, so drift hits every case alike
            runs[name].append(step_ms(slots))
            print(f"repeat {rep} {name:11s} (slots up to {max(slots)}): "
                  f"{runs[name][-1]:.1f} ms a step", flush=True)
    result = {
        "config": {"n_ctx": N_CTX, "slots": N_SLOTS, "threads": THREADS,
                   "steps": args.steps, "repeats": args.repeats,
                   "machine": platform.processor() or platform.machine()},
        "cases": {name: {"slots": CASES[name], "step_ms": runs[name],
                         "median_ms": statistics.median(runs[name])} for name in CASES},
    }
    for n in (12, 20):
        result[f"spread_over_compact_{n}"] = (result["cases"][f"spread {n}"]["median_ms"]
                                             / result["cases"][f"compact {n}"]["median_ms"])
        print(f"{n} sequences: spread / compact = {result[f'spread_over_compact_{n}']:.2f}x")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    plot(result, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(result["cases"])
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar(names, [result["cases"][n]["median_ms"] for n in names],
           color=["tab:blue" if n.startswith("compact") else "tab:red" for n in names])
    ax.set_ylabel("decode step, ms (median)")
    ax.set_title("Gemma 3 270M, 32 slots of 1024 cells: where the batch sits")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
