"""Python per step: the continuous engine against the bare backend loop at the same batch.

For each batch size B: the bare loop feeds B one-token chunks per ``forward`` (no engine:
the ceiling); the engine runs B greedy requests of ``--tokens`` new tokens (EOS ignored,
no HTTP) through plan → apply → forward → choose → stream. Both in one process, on the
same model, interleaved twice; the steady-state decode rate of each is compared. With
``--py-spy`` the engine runs again under py-spy (``py-spy record``), writing a flame
graph SVG, to show where the engine's own time goes.

    flock /tmp/sluice-heavy.lock python bench/engine_overhead.py          # about 2 min
    flock /tmp/sluice-heavy.lock python bench/engine_overhead.py --py-spy

Writes bench/results/engine_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sluice.backends.base import ForwardChunk, ModelSpec
from sluice.backends.llamacpp import LlamaCppBackend, LlamaCppGenerative
from sluice.engine.continuous import ContinuousEngine, EngineConfig
from sluice.engine.request import Request, SamplingParams

RESULTS = Path(__file__).resolve().parent / "results"
PROMPT = "Once upon a time there was a lighthouse keeper who"


def load(n_seq_max: int) -> LlamaCppGenerative:
    spec = ModelSpec("g", "generative", "llamacpp", 1, options={
        "n_ctx": 8192, "n_seq_max": n_seq_max, "n_threads": 2})
    model = LlamaCppBackend().load(spec)
    assert isinstance(model, LlamaCppGenerative)
    return model


def bare_tokens_per_s(model: LlamaCppGenerative, batch: int, steps: int) -> float:
    toks = model.tokenize(PROMPT, add_bos=True)
    for s in range(batch):
        model.release_sequence(s)
    model.forward([ForwardChunk(s, tuple(toks), 0, True) for s in range(batch)])
    t = time.perf_counter()
    for i in range(steps):
        model.forward([ForwardChunk(s, (toks[-1],), len(toks) + i, True) for s in range(batch)])
    elapsed = time.perf_counter() - t
    for s in range(batch):
        model.release_sequence(s)
    return batch * steps / elapsed


def engine_tokens_per_s(model: LlamaCppGenerative, batch: int, steps: int) -> float:
    """Decode rate once every sequence decodes (the prefill step is not counted)."""
    times: list[float] = []
    engine = ContinuousEngine(model, EngineConfig(), time.monotonic, lambda r: None)
    toks = tuple(model.tokenize(PROMPT, add_bos=True))
    for i in range(batch):
        req = Request(request_id=i + 1, model_id="g", kind="generative",
                      arrival_s=time.monotonic(), prompt_tokens=toks,
                      params=SamplingParams(max_tokens=steps + 1, temperature=0.0,
                                            ignore_eos=True))
        req.mark_queued(time.monotonic())
        engine.add(req)
    engine.step()  # admissions and prefill
    while engine.has_work:
        engine.step()
        times.append(time.perf_counter())
    # every step from the second on decodes all sequences
    return batch * (len(times) - 2) / (times[-2] - times[0])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="8,32")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--py-spy", action="store_true")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    if args.child:
        model = load(max(batches))
        for _ in range(3):
            engine_tokens_per_s(model, args.child, args.tokens)
        return 0
    model = load(max(batches))
    rows: list[dict[str, Any]] = []
    t0 = time.time()
    for batch in batches:
        bare, eng = [], []
        for _ in range(2):  # interleaved
            bare.append(bare_tokens_per_s(model, batch, args.tokens))
            eng.append(engine_tokens_per_s(model, batch, args.tokens))
        row = {"batch": batch, "bare_tokens_per_s": max(bare), "engine_tokens_per_s": max(eng),
               "ratio": round(max(eng) / max(bare), 3), "all_bare": bare, "all_engine": eng}
        rows.append(row)
        print(f"batch {batch:3d}: bare {row['bare_tokens_per_s']:6.1f} tok/s, engine "
              f"{row['engine_tokens_per_s']:6.1f} tok/s: {row['ratio']:.3f}x", flush=True)
    result = {"benchmark": "engine_overhead", "tokens": args.tokens, "rows": rows,
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0))}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "engine_overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    if args.py_spy:
        spy = shutil.which("py-spy")
        if spy is None:
            print("py-spy is not installed", file=sys.stderr)
            return 1
        out = RESULTS / f"engine_overhead_b{max(batches)}.svg"
        subprocess.run([spy, "record", "-o", str(out), "--rate", "200", "--", sys.executable,
                        __file__, "--batches", args.batches, "--tokens", str(args.tokens),
                        "--child", str(max(batches))], check=True)
        print(f"flame graph: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
