"""The headline LLM comparison's settings and one measured phase, shared by the benchmarks
that set sluice beside llama-server on them (``bench/llm_bench.py``, ``bench/ab.py``): the
same slots, context and threads on both servers, and ``MAX_TOKENS`` streamed new tokens a
request."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from bench.lib.loadgen import closed_loop, open_loop, summarize
from bench.lib.model_tables import llm_table, server_tables
from bench.lib.prompts import PROMPTS
from bench.lib.report import TPOT_SLO_S, TTFT_SLO_S, ms

N_CTX, N_SLOTS, THREADS, MAX_TOKENS = 8192, 8, 2, 128


def sluice_toml(model: str, gguf: Path, mode: str, prefix_reuse: bool = True,
                workers_extra: str = "", model_extra: str = "") -> str:
    """sluice serving ``gguf`` as ``model`` with llama-server's settings: 8 slots over 8192
    cells, 2 threads, batches of up to 512 tokens; ``workers_extra`` and ``model_extra`` are
    more TOML lines of the ``[workers]`` table (``isolation = "process"``) and of the
    model's (``speculation = "off"``)."""
    return server_tables(model, 512, 256, budget_bytes=4_000_000_000) + workers_extra + f"""
[engine]
mode = "{mode}"
max_batch_tokens = 512
prefill_chunk_tokens = 256
static_max_wait_ms = 50
prefix_reuse = {"true" if prefix_reuse else "false"}
""" + llm_table(model, str(gguf), n_ctx=N_CTX, n_seq_max=N_SLOTS, n_threads=THREADS,
                extra=model_extra)


def measure(name: str, base_url: str, model: str, plan: dict[str, Any]) -> dict[str, Any]:
    """Run one closed- or open-loop phase against ``base_url``; its summary row."""
    if plan["kind"] == "closed":
        samples, wall = asyncio.run(closed_loop(
            base_url, model, PROMPTS, concurrency=plan["concurrency"],
            n_requests=plan["n_requests"], max_tokens=MAX_TOKENS))
    else:
        samples, wall = asyncio.run(open_loop(
            base_url, model, PROMPTS, rate_per_s=plan["rate_per_s"],
            n_requests=plan["n_requests"], max_tokens=MAX_TOKENS, seed=plan["seed"]))
    row = {**plan, **summarize(samples, wall, ttft_slo_s=TTFT_SLO_S, tpot_slo_s=TPOT_SLO_S),
           "system": name}
    print(f"  {name:18s} {plan['label']:>6s}: {row['tokens_per_s']:7.1f} tok/s  "
          f"ttft p50 {ms(row['ttft_p50_s'])} p95 {ms(row['ttft_p95_s'])}  "
          f"tpot p50 {ms(row['tpot_p50_s'])}  errors {row['errors']}", flush=True)
    return row
