"""N-gram speculation: sluice with ``speculation = "off"`` against ``"auto"`` on the packaged
default model, on work whose output repeats its input and on free chat.

Question: where the answer copies the prompt (repeat, quote, rewrite a passage), how much
faster does a stream get when the engine drafts from the prompt, and does drafting cost
anything where the answer does not (free chat) or where the batch is large? Both servers
run the packaged SmolLM2-135M-Instruct as ``sluice serve`` ships it (32 slots, the 150 ms
TPOT target, the step-time prior measured at load) but for its first-token target, which
is left out: a closed loop of a few clients never needs it, and a refusal there would
measure admission rather than drafting. One server has each setting, side by side;
each level runs both back to back, in alternating order, so drift of the host hits them
alike. Every request is a greedy streamed chat completion (temperature 0,
``stream_options.include_usage``: tokens are the usage's completion tokens, TPOT is the
stream's first-to-last token time over them, less one).

- ``grounded``: "Repeat exactly", "Quote word for word" and "Copy out" requests over four
  passages of about 200 tokens each (``PASSAGES``), up to 320 new tokens;
- ``free``: the benchmarks' open-ended prompts (``bench.lib.prompts.PROMPTS``), up to 128.

Closed loops at 1, 2, 4 and 8 clients (``--quick``: 1 and 4, fewer requests; under three
minutes on 2 cores). Before the loops each prompt is sent once alone to both servers and
the texts compared (greedy output must be the same with and without drafting); after each
run the server's drafted and accepted tokens (``/status.json``) are recorded.

Prints a table (tokens/s and TPOT p50/p95 of each setting, the ratio auto / off, the
acceptance) and writes ``bench/results/speculation.json`` and ``.png``. Run it alone on
the host: the numbers are the machine's.

    python bench/speculation.py --quick
    python bench/speculation.py
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.loadgen import percentile
from bench.lib.model_tables import llm_table, server_tables
from bench.lib.prompts import PROMPTS
from bench.lib.report import markdown_table, ms, ratio
from bench.lib.servers import free_port, running, sluice_cmd
from bench.llm_bench import commit, machine

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = "smollm2-135m-instruct"
SETTINGS = ("off", "auto")
MAX_TOKENS = {"grounded": 320, "free": 128}

PASSAGES = [
    "The river rises in the hills above the town, where three small streams meet in a "
    "meadow of tall grass. From there it runs past the old stone mill, which ground flour "
    "for the whole valley until the railway came, and under the narrow bridge that the "
    "market carts still cross every Saturday morning. In the town it widens and slows. "
    "Children fish from the steps behind the church, and in summer the boatmen take "
    "visitors down to the weir and back for a few coins. Below the town the water turns "
    "brown with the clay of the lower fields, and the banks are lined with willows that "
    "the farmers cut every few years for baskets and fences. The river reaches the sea at "
    "a harbour where fishing boats have landed their catch for three hundred years.",
    "To make the bread, mix five hundred grams of flour with ten grams of salt and seven "
    "grams of dried yeast in a large bowl. Add three hundred and fifty millilitres of warm "
    "water and stir until no dry flour is left. Cover the bowl with a cloth and leave the "
    "dough to rest for half an hour. Then fold it over itself a few times with wet hands, "
    "cover it again and wait another half hour. Repeat the folding twice more. When the "
    "dough has doubled in size, shape it into a round loaf on a floured board and let it "
    "rise for forty minutes. Heat the oven to two hundred and thirty degrees with a heavy "
    "pot inside. Put the loaf in the hot pot, cover it and bake for thirty minutes, then "
    "remove the lid and bake for fifteen more, until the crust is deep brown.",
    "The library opens at nine in the morning and closes at eight in the evening from "
    "Monday to Friday. On Saturdays it closes at five, and it is closed on Sundays and "
    "public holidays. Members may borrow up to twelve items at a time for three weeks and "
    "may renew them twice, online or at the front desk, unless another member has "
    "reserved them. Late returns cost twenty cents a day for each item. Children's story "
    "time takes place on Wednesday mornings at ten, and the reading club meets on the "
    "first Thursday of every month in the room upstairs. Quiet study rooms can be booked "
    "for two hours at a time. Printing and copying cost ten cents a page, and the "
    "computers in the hall can be used for one hour a day with a library card.",
    "Before the meeting, every team sends a short written update to the project lead by "
    "Tuesday evening. The update lists what was finished in the last week, what is "
    "planned for the next week, and anything that is blocked and needs help from another "
    "team. The meeting itself starts at ten on Wednesday and lasts no more than forty "
    "minutes. The project lead reads out the blocked items first and asks who can help "
    "with each one. Then each team has three minutes for questions about its update. "
    "Decisions are written into the shared document during the meeting, with the name of "
    "the person who will act on each of them and the date by which it should be done. "
    "Anything that needs a longer discussion is moved to a separate meeting that week.",
]
"""Passages of about 200 tokens each that the grounded requests repeat."""

GROUNDED = [f"{ask}\n\n{passage}" for passage in PASSAGES for ask in (
    "Repeat the following text exactly, word for word:",
    "Quote this passage back to me without changing anything:",
    "Copy out the following text exactly as it is written:")]
"""Input-grounded requests: the answer is the passage."""
WORKLOADS = {"grounded": GROUNDED, "free": PROMPTS}


@dataclass(frozen=True)
class Reply:
    """One streamed chat completion as the client saw it."""

    ok: bool
    text: str = ""
    tokens: int = 0
    ttft_s: float | None = None
    tpot_s: float | None = None
    error: str | None = None


async def chat(client: httpx.AsyncClient, base: str, prompt: str, max_tokens: int) -> Reply:
    """A greedy streamed chat completion of ``prompt``: its text, usage tokens, TTFT and
    TPOT (first to last content chunk over the tokens after the first)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = last = None
    parts: list[str] = []
    tokens = 0
    try:
        async with client.stream("POST", f"{base}/v1/chat/completions", json=body,
                                 timeout=600.0) as resp:
            if resp.status_code != 200:
                return Reply(False, error=f"{resp.status_code}: {(await resp.aread())[:200]!r}")
            async for line in resp.aiter_lines():
                if not line.startswith("data:") or line.endswith("[DONE]"):
                    continue
                chunk = json.loads(line[5:])
                now = time.perf_counter()
                for choice in chunk.get("choices", []):
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        parts.append(text)
                        first = now if first is None else first
                        last = now
                if chunk.get("usage"):
                    tokens = int(chunk["usage"]["completion_tokens"])
    except (httpx.HTTPError, OSError) as exc:
        return Reply(False, error=f"{type(exc).__name__}: {exc}"[:200])
    ttft = None if first is None else first - t0
    tpot = (last - first) / (tokens - 1) if first is not None and last is not None \
        and tokens > 1 else None
    return Reply(True, "".join(parts), tokens, ttft, tpot)


async def closed(base: str, prompts: Sequence[str], max_tokens: int, concurrency: int,
                 n_requests: int) -> tuple[list[Reply], float]:
    """``concurrency`` clients sending back to back until ``n_requests`` are done."""
    todo = iter(range(n_requests))
    replies: list[Reply] = []
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=concurrency + 2)) as c:
        async def user() -> None:
            for i in todo:
                replies.append(await chat(c, base, prompts[i % len(prompts)], max_tokens))
        t0 = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(concurrency)))
        return replies, time.perf_counter() - t0


def drafted(base: str) -> tuple[int, int]:
    """The server's drafted and accepted tokens so far (``/status.json``)."""
    status = httpx.get(f"{base}/status.json", timeout=30.0).json()
    d = a = 0
    for worker in status["workers"]:
        for m in worker["models"]:
            spec = m.get("speculation") or {}
            d, a = d + spec.get("draft_tokens", 0), a + spec.get("accepted_tokens", 0)
    return d, a


def row_of(setting: str, workload: str, concurrency: int, replies: Sequence[Reply],
           wall_s: float, counts: tuple[int, int]) -> dict[str, Any]:
    ok = [r for r in replies if r.ok]
    tpot = [r.tpot_s for r in ok if r.tpot_s is not None]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    tokens = sum(r.tokens for r in ok)
    row = {"setting": setting, "workload": workload, "concurrency": concurrency,
           "requests": len(replies), "errors": len(replies) - len(ok), "wall_s": round(wall_s, 3),
           "tokens": tokens, "tokens_per_s": tokens / wall_s if wall_s > 0 else 0.0,
           "ttft_p50_s": percentile(ttft, 0.5), "tpot_p50_s": percentile(tpot, 0.5),
           "tpot_p95_s": percentile(tpot, 0.95), "draft_tokens": counts[0],
           "accepted_tokens": counts[1],
           "acceptance": round(counts[1] / counts[0], 3) if counts[0] else None}
    print(f"  {setting:4s} {workload:8s} c={concurrency:<2d} {row['tokens_per_s']:7.1f} tok/s  "
          f"tpot p50 {ms(row['tpot_p50_s'])} p95 {ms(row['tpot_p95_s'])}  drafted "
          f"{counts[0]} accepted {counts[1]}  errors {row['errors']}", flush=True)
    return row


def sluice_toml(setting: str) -> str:
    """The packaged default model as ``sluice serve`` runs it (without its first-token
    target), with ``speculation``."""
    extra = f'tpot_target_ms = 150\nstep_cost_warmup = true\nspeculation = "{setting}"'
    return (server_tables(MODEL, 64, 32, budget_bytes=4_000_000_000)
            + "\n[engine]\nmax_retained_slots = 4\n"
            + llm_table(MODEL, f"packaged:{MODEL}", n_ctx=32 * 1024, n_seq_max=32,
                        n_threads=2, extra=extra))


def same_output(bases: dict[str, str], quick: bool) -> dict[str, Any]:
    """Each workload's prompts (a few with ``quick``) sent alone to both servers: how many
    texts are the same with drafting on and off."""
    out: dict[str, Any] = {}

    async def alone(base: str, prompts: Sequence[str], max_tokens: int) -> list[Reply]:
        async with httpx.AsyncClient() as c:
            return [await chat(c, base, p, max_tokens) for p in prompts]
    for workload, prompts in WORKLOADS.items():
        chosen = list(prompts[:: 4 if quick else 1])
        texts = {s: [r.text for r in asyncio.run(alone(base, chosen, MAX_TOKENS[workload]))]
                 for s, base in bases.items()}
        same = sum(a == b for a, b in zip(texts["off"], texts["auto"], strict=True))
        out[workload] = {"prompts": len(chosen), "identical": same}
        print(f"  {workload}: {same} of {len(chosen)} greedy outputs identical", flush=True)
    return out


def table(rows: list[dict[str, Any]]) -> str:
    body = []
    for r in rows:
        if r["setting"] != "auto":
            continue
        off = next(o for o in rows if o["setting"] == "off" and o["workload"] == r["workload"]
                   and o["concurrency"] == r["concurrency"])
        x = ratio(r["tokens_per_s"], off["tokens_per_s"])
        body.append([r["workload"], str(r["concurrency"]), f"{off['tokens_per_s']:.1f}",
                     f"{r['tokens_per_s']:.1f}", "-" if x is None else f"**{x:.2f}×**",
                     f"{ms(off['tpot_p50_s'])} / {ms(r['tpot_p50_s'])}",
                     f"{ms(off['tpot_p95_s'])} / {ms(r['tpot_p95_s'])}",
                     "-" if r["acceptance"] is None else f"{r['acceptance']:.2f}"])
    return markdown_table(["workload", "clients", "off tok/s", "auto tok/s", "auto / off",
                           "TPOT p50 (off / auto)", "TPOT p95 (off / auto)", "acceptance"],
                          body)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="1 and 4 clients, fewer requests (under three minutes)")
    parser.add_argument("--out", type=Path, default=RESULTS / "speculation.json",
                        help="the JSON to write (the PNG goes beside it)")
    parser.add_argument("--levels", type=int, nargs="+", default=None,
                        help="client counts to run instead (a smoke check: --levels 1)")
    parser.add_argument("--requests", type=int, default=None,
                        help="requests per level and setting instead of the default")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="new tokens a request instead of each workload's default")
    args = parser.parse_args(argv)
    levels = args.levels or ([1, 4] if args.quick else [1, 2, 4, 8])
    if args.max_tokens is not None:
        MAX_TOKENS.update(dict.fromkeys(MAX_TOKENS, args.max_tokens))
    t_start = time.time()
    rows: list[dict[str, Any]] = []
    RESULTS.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        bases: dict[str, str] = {}
        for setting in SETTINGS:
            port = free_port()
            cmd, _ = sluice_cmd(sluice_toml(setting), port)
            bases[setting] = f"http://127.0.0.1:{port}"
            stack.enter_context(running(cmd, f"{bases[setting]}/ready",
                                        log_path=RESULTS / f"speculation_{setting}.log"))
        print("greedy output, each prompt alone", flush=True)
        identical = same_output(bases, args.quick)
        print(f"closed loop, {MODEL}", flush=True)
        for i, c in enumerate(levels):
            for workload, prompts in WORKLOADS.items():
                n = args.requests or (max(2, c) if args.quick else max(4, 2 * c))
                for setting in (SETTINGS if i % 2 == 0 else tuple(reversed(SETTINGS))):
                    before = drafted(bases[setting])
                    replies, wall = asyncio.run(closed(bases[setting], prompts,
                                                       MAX_TOKENS[workload], c, n))
                    after = drafted(bases[setting])
                    rows.append(row_of(setting, workload, c, replies, wall,
                                       (after[0] - before[0], after[1] - before[1])))
    result: dict[str, Any] = {
        "benchmark": "speculation", "quick": args.quick, "model": MODEL,
        "max_tokens": MAX_TOKENS, "levels": levels, "identical_outputs": identical,
        "machine": machine(), "commit": commit(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t_start)), "rows": rows,
    }
    result["duration_s"] = round(time.time() - t_start, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    plot(result, args.out.with_suffix(".png"))
    print()
    print(table(rows))
    print(f"\nwrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    workloads = list(WORKLOADS)
    fig, axes = plt.subplots(2, len(workloads), figsize=(6 * len(workloads), 8), squeeze=False)
    for j, workload in enumerate(workloads):
        for setting in SETTINGS:
            mine = sorted((r for r in rows if r["setting"] == setting
                           and r["workload"] == workload), key=lambda r: r["concurrency"])
            x = [r["concurrency"] for r in mine]
            axes[0][j].plot(x, [r["tokens_per_s"] for r in mine], marker="o",
                            label=f"speculation {setting}")
            axes[1][j].plot(x, [(r["tpot_p50_s"] or 0) * 1000 for r in mine], marker="o",
                            label=f"{setting} p50")
            axes[1][j].plot(x, [(r["tpot_p95_s"] or 0) * 1000 for r in mine], marker="x",
                            linestyle="--", label=f"{setting} p95")
        axes[0][j].set(xscale="log", xlabel="concurrent clients", ylabel="generated tokens/s",
                       title=f"{workload}: throughput")
        axes[1][j].set(xscale="log", xlabel="concurrent clients", ylabel="TPOT (ms)",
                       title=f"{workload}: time per output token")
        for ax in (axes[0][j], axes[1][j]):
            ax.set_xticks(result["levels"], labels=[str(c) for c in result["levels"]])
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle(f"n-gram speculation off vs auto, {result['model']} "
                 f"({result['started'][:10]})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    raise SystemExit(main())
