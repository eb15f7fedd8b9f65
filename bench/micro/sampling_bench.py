"""Tokens/s of the engine on the real model with logprobs, with penalties and with
constrained decoding, each as a ratio to plain sampling measured in the same run.

The continuous-batching engine drives the packaged Gemma 3 270M (llama.cpp, 2 threads) at
batch 1 and 8; every configuration runs the same prompts for the same number of steps,
the configurations interleaved over ``--repeats`` rounds so that machine drift hits all
alike. Also reported: the engine's per-step time outside the forward pass (choosing,
streaming) and, on logits rows the model produced, the per-row cost of the sampler
against the sampler it replaced (float64 ``exp`` + running sum, kept below as
``legacy_sample_token`` for this comparison only).

    .venv/bin/python bench/micro/sampling_bench.py

Writes ``bench/results/sampling_bench.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from sluice.backends.base import ForwardChunk, ModelSpec
from sluice.backends.llamacpp import LlamaCppBackend, LlamaCppGenerative
from sluice.engine.continuous import ContinuousEngine, EngineConfig
from sluice.engine.request import Constraint, Request, SamplingParams
from sluice.engine.sampling import sample_token

RESULTS = Path(__file__).resolve().parents[1] / "results"
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "city": {"type": "string"},
        "hobbies": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "city", "hobbies"],
    "additionalProperties": False,
}
PROMPTS = [
    "Describe a fictional person as JSON.",
    "Write a short story about a lighthouse keeper.",
    "Explain how rain forms, step by step.",
    "List some ideas for a birthday party.",
    "What makes a good cup of coffee?",
    "Tell me about the history of bicycles.",
    "Give advice to a new gardener.",
    "Describe the city of Lisbon.",
]
BASE = {"temperature": 0.8, "top_p": 0.95}
CONFIGS: dict[str, dict[str, Any]] = {
    "plain": {},
    "logprobs": {"logprobs": True, "top_logprobs": 5},
    "penalties": {"presence_penalty": 0.5, "frequency_penalty": 0.5,
                  "repetition_penalty": 1.1},
    "constrained": {"constraint": Constraint("json_schema", json.dumps(SCHEMA))},
}


def legacy_sample_token(logits: np.ndarray, temperature: float, top_p: float,
                        rng: np.random.Generator) -> int:
    """The sampler before issue 12 (float64 scaling and ``exp``, a running sum over the
    row, the whole row sorted when the top-p nucleus passed 1,024 tokens)."""
    scaled = logits.astype(np.float64) / temperature
    top = float(scaled.max())
    size = scaled.size
    weights = np.exp(scaled - top)
    total = float(weights.sum())
    if top_p >= 1.0:
        cdf = np.cumsum(weights)
        return min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), size - 1)
    cand = np.argpartition(scaled, -1024)[-1024:]
    if float(weights[cand].sum()) < top_p * total:
        cand = np.arange(size)
    vals = scaled[cand]
    order = np.argsort(-vals, kind="stable")
    cand, probs = cand[order], np.exp(vals[order] - top)
    keep = int(np.searchsorted(np.cumsum(probs) / total, top_p) + 1)
    cand, probs = cand[:keep], probs[:keep]
    return int(cand[int(rng.choice(cand.size, p=probs / probs.sum()))])


def _load(n_seq_max: int) -> LlamaCppGenerative:
    spec = ModelSpec("gemma-3-270m", "generative", "llamacpp", 400 * 2**20,
                     options={"path": "packaged:gemma-3-270m", "chat_template": "gemma",
                              "n_ctx": 512 * n_seq_max, "n_seq_max": n_seq_max,
                              "n_threads": 2})
    return LlamaCppBackend().load(spec)


class _StepTimer:
    """Time the engine spends after each forward pass (choosing, streaming)."""

    def __init__(self) -> None:
        self.update_s = 0.0
        self.steps = 0

    def wrap(self, engine: ContinuousEngine) -> None:
        inner = engine._update

        def timed(batch: Any, logits: np.ndarray) -> None:
            t0 = time.perf_counter()
            inner(batch, logits)
            self.update_s += time.perf_counter() - t0
            self.steps += 1

        engine._update = timed  # type: ignore[method-assign]


def run_config(model: LlamaCppGenerative, batch: int, params: dict[str, Any],
               max_tokens: int, seed: int) -> dict[str, float]:
    """One engine run of ``batch`` requests; tokens/s over the whole run."""
    reqs = []
    for i in range(batch):
        prompt = model.render_chat([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}])
        req = Request(request_id=i + 1, model_id="gemma", kind="generative", arrival_s=0.0,
                      prompt_tokens=tuple(model.tokenize(prompt, add_bos=True)),
                      params=SamplingParams(max_tokens=max_tokens, seed=seed + i,
                                            ignore_eos=True, **BASE, **params))
        req.mark_queued(0.0)
        reqs.append(req)
    engine = ContinuousEngine(model, EngineConfig(), time.monotonic, lambda r: None)
    timer = _StepTimer()
    timer.wrap(engine)
    for req in reqs:
        engine.add(req)
    t0 = time.perf_counter()
    while engine.has_work:
        engine.step()
    wall = time.perf_counter() - t0
    tokens = sum(r.final.completion_tokens for r in reqs if r.final)
    failed = [r.final.error for r in reqs if r.final and r.final.error]
    if failed:
        raise RuntimeError(f"requests failed: {failed[:2]}")
    return {"tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall,
            "update_ms_per_step": 1000 * timer.update_s / max(1, timer.steps)}


def sampler_rows_cost(model: LlamaCppGenerative, n_rows: int = 16) -> dict[str, Any]:
    """Per-row cost of the current and the legacy sampler on rows the model produced."""
    rows = []
    tokens = model.tokenize(model.render_chat(
        [{"role": "user", "content": PROMPTS[1]}]), add_bos=True)
    model.release_sequence(0)
    row = model.forward([ForwardChunk(0, tuple(tokens), 0, True)])[0]
    pos = len(tokens)
    for _ in range(n_rows):
        rows.append(row.copy())
        nxt = int(np.argmax(row))
        row = model.forward([ForwardChunk(0, (nxt,), pos, True)])[0]
        pos += 1
    model.release_sequence(0)
    out: dict[str, Any] = {}
    cases: dict[str, tuple[Callable[[np.ndarray, np.random.Generator], int], ...]] = {
        "temperature 0.8": (
            lambda r, g: sample_token(r, SamplingParams(temperature=0.8), g),
            lambda r, g: legacy_sample_token(r, 0.8, 1.0, g)),
        "temperature 0.8, top_p 0.95": (
            lambda r, g: sample_token(r, SamplingParams(temperature=0.8, top_p=0.95), g),
            lambda r, g: legacy_sample_token(r, 0.8, 0.95, g)),
    }
    for name, (current, legacy) in cases.items():
        per: dict[str, float] = {}
        for label, fn in (("current", current), ("legacy", legacy)):
            rng = np.random.default_rng(0)
            times = []
            for _ in range(3):
                for r in rows:
                    t0 = time.perf_counter()
                    fn(r, rng)
                    times.append(time.perf_counter() - t0)
            per[f"{label}_ms"] = round(1000 * statistics.median(times), 3)
        per["speedup"] = round(per["legacy_ms"] / per["current_ms"], 2)
        out[name] = per
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", default="1,8")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    model = _load(max(batches))
    # Warm the grammar vocabulary and compiled schema once (a one-off per process).
    run_config(model, 1, CONFIGS["constrained"], 4, 0)
    raw: dict[str, dict[str, list[dict[str, float]]]] = {}
    for batch in batches:
        raw[str(batch)] = {name: [] for name in CONFIGS}
        for rep in range(args.repeats):
            for name, params in CONFIGS.items():
                result = run_config(model, batch, params, args.max_tokens, seed=100 * rep)
                raw[str(batch)][name].append(result)
                print(batch, name, rep, {k: round(v, 2) for k, v in result.items()},
                      flush=True)
    summary: dict[str, Any] = {}
    for batch, per in raw.items():
        plain = statistics.median(r["tokens_per_s"] for r in per["plain"])
        summary[batch] = {
            name: {
                "tokens_per_s": round(statistics.median(r["tokens_per_s"] for r in runs), 2),
                "ratio_to_plain": round(
                    statistics.median(r["tokens_per_s"] for r in runs) / plain, 3),
                "update_ms_per_step": round(
                    statistics.median(r["update_ms_per_step"] for r in runs), 2),
            }
            for name, runs in per.items()
        }
    rows = sampler_rows_cost(model)
    model.close()
    out = {
        "machine": {"cpu": platform.processor() or platform.machine(),
                    "python": platform.python_version()},
        "model": "gemma-3-270m Q4_K_M (packaged), llama.cpp n_threads=2",
        "max_tokens": args.max_tokens, "repeats": args.repeats,
        "base_params": BASE, "configs": {k: {kk: str(vv) for kk, vv in v.items()}
                                         for k, v in CONFIGS.items()},
        "summary": summary, "sampler_row_cost": rows, "runs": raw,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "sampling_bench.json").write_text(json.dumps(out, indent=2) + "\n")
    _plot(summary, RESULTS / "sampling_bench.png")
    print(json.dumps({"summary": summary, "sampler_row_cost": rows}, indent=2))


def _plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(CONFIGS)
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(summary)
    for i, (batch, per) in enumerate(summary.items()):
        xs = [k + i * width for k in range(len(names))]
        ratios = [per[n]["ratio_to_plain"] for n in names]
        bars = ax.bar(xs, ratios, width, label=f"batch {batch}")
        for bar, name in zip(bars, names, strict=True):
            ax.annotate(f"{per[name]['tokens_per_s']:.0f} tok/s",
                        (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=7)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks([k + width * (len(summary) - 1) / 2 for k in range(len(names))], names)
    ax.set_ylabel("tokens/s relative to plain sampling")
    ax.set_title("Sampling features on Gemma 3 270M (llama.cpp, 2 threads)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
