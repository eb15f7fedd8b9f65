"""One sluice replica, a repeated system prompt: TTFT with the retained prefix cache on
vs off (``engine.retain_prefixes``), on the real model.

Workload: one client, requests one after another (so no sequence is running when the next
arrives: only a retained prefix can serve it), each the same ~``--system-words``-word
system prompt plus a different short question, streamed from ``/v1/completions`` with
``--max-tokens`` new tokens. Both servers stay up and take turns request by request
(interleaved), so drift of this shared host hits both alike. Reports TTFT p50/p95 and
the ratio; ``bench/results/prefix_retention.{json,png}``.

    python bench/prefix_retention.py

Run it alone on the host (two llama.cpp threads for about a minute).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.lib.loadgen import closed_loop, percentile  # noqa: E402
from bench.lib.model_tables import GEMMA, gemma_table  # noqa: E402
from bench.lib.prompts import QUESTIONS, system_prompt  # noqa: E402
from bench.lib.servers import free_port, running, sluice_cmd  # noqa: E402
from sluice.backends.packaged import gemma_gguf_path  # noqa: E402

MODEL = GEMMA


def sluice_toml(gguf: Path, retain: bool, threads: int) -> str:
    return f"""
[server]
default_model = "{MODEL}"
[workers]
count = 1
budget_bytes = 4_000_000_000
[engine]
max_batch_tokens = 512
prefill_chunk_tokens = 256
prefix_reuse = true
retain_prefixes = {"true" if retain else "false"}
""" + gemma_table(str(gguf), n_seq_max=4, n_threads=threads)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--system-words", type=int, default=300)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "prefix_retention.json"))
    args = ap.parse_args()
    gguf = gemma_gguf_path()
    system = system_prompt(0, args.system_words)
    texts = [system + QUESTIONS[i % len(QUESTIONS)] + f" (ticket {i})\nAnswer:"
             for i in range(args.requests)]
    ttft: dict[str, list[float]] = {"retain": [], "no_retain": []}
    with contextlib.ExitStack() as stack:
        bases = {}
        for name, retain in (("retain", True), ("no_retain", False)):
            port = free_port()
            cmd, _ = sluice_cmd(sluice_toml(gguf, retain, args.threads), port)
            bases[name] = f"http://127.0.0.1:{port}"
            stack.enter_context(running(cmd, f"{bases[name]}/ready"))
            # warm-up with another prompt: nothing of the system prompt is cached yet
            asyncio.run(closed_loop(bases[name], MODEL, ["Hello there, how are you?"],
                                    concurrency=1, n_requests=1, max_tokens=2))
        for i, text in enumerate(texts):
            order = list(bases) if i % 2 == 0 else list(reversed(bases))
            for name in order:
                samples, _ = asyncio.run(closed_loop(bases[name], MODEL, [text], concurrency=1,
                                                     n_requests=1, max_tokens=args.max_tokens))
                [s] = samples
                if not s.ok or s.ttft_s is None:
                    raise RuntimeError(f"{name}: request {i} failed ({s.status})")
                ttft[name].append(s.ttft_s)
    rows = {name: {"ttft_p50_s": percentile(v, 0.5), "ttft_p95_s": percentile(v, 0.95),
                   "ttft_first_s": v[0], "ttft_s": v} for name, v in ttft.items()}
    after_first = {name: percentile(v[1:], 0.5) for name, v in ttft.items()}
    result: dict[str, Any] = {
        "params": vars(args) | {"model": MODEL, "cpus": os.cpu_count(),
                                "prompt_tokens_note": "system prompt + question, see text"},
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": rows,
        "ratios": {
            "ttft_p50_no_retain_over_retain": rows["no_retain"]["ttft_p50_s"]  # type: ignore[operator]
            / rows["retain"]["ttft_p50_s"],
            "ttft_p50_after_first_no_retain_over_retain": after_first["no_retain"]  # type: ignore[operator]
            / after_first["retain"],
        },
    }
    for name, row in rows.items():
        print(f"{name:>9}: TTFT p50 {row['ttft_p50_s'] * 1000:.0f} ms, p95 "
              f"{row['ttft_p95_s'] * 1000:.0f} ms, first {row['ttft_first_s'] * 1000:.0f} ms")
    print(json.dumps(result["ratios"], indent=2))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    plot(result, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, row in result["rows"].items():
        ax.plot(range(1, len(row["ttft_s"]) + 1), [t * 1000 for t in row["ttft_s"]],
                marker="o", label=f"{name} (p50 {row['ttft_p50_s'] * 1000:.0f} ms)")
    ax.set_xlabel("request (same system prompt, one at a time)")
    ax.set_ylabel("TTFT (ms)")
    ax.set_title("Retained prefix cache: one replica, a repeated system prompt")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
