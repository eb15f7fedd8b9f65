"""N-gram speculation on the packaged default model: sluice with ``speculation = "off"``
and ``"auto"`` beside llama.cpp's ``llama-server`` without speculation and with its best
``--spec-type ngram-*``, on work whose output repeats its input and on free chat.

Question: where the answer copies the prompt (repeat, quote, rewrite a passage), how much
faster does a stream get when the engine drafts from the prompt, against a peer that
drafts a fixed length whatever the load, and does drafting cost anything where the
answer does not (free chat) or where the batch is large? Both sluice servers run the
packaged SmolLM2-135M-Instruct as ``sluice serve`` ships it (32 slots of 1024 KV cells,
the 150 ms TPOT target, the step-time prior measured at load) but for its first-token
target, which is left out: a closed loop of a few clients never needs it, and a refusal
there would measure admission rather than drafting. The llama-servers serve the same
GGUF with the same llama.cpp, threads and KV cells (``-np`` = the most clients run,
``-c`` = 1024 a slot; ``bench.lib.llama_server``), one without speculation and one per
n-gram type chosen, each with llama-server's own draft lengths. Every server is up for
the whole run; each level runs them back to back, in an order that rotates from level to
level, so drift of the host hits them alike. Every request is a greedy streamed chat
completion (temperature 0, ``stream_options.include_usage``: tokens are the usage's
completion tokens, TPOT is the stream's first-to-last token time over them, less one).

- ``grounded``: "Repeat exactly", "Quote word for word" and "Copy out" requests over four
  passages of about 200 tokens each (``PASSAGES``), up to 320 new tokens;
- ``free``: the benchmarks' open-ended prompts (``bench.lib.prompts.PROMPTS``), up to 128.

Steps:

1. greedy output: each prompt sent once alone to every server (``--quick``: every fourth)
   and the texts compared with sluice off's (the goal: sluice auto's identical);
2. the n-gram probe: every ``--spec-type ngram-*`` this llama-server build accepts (its
   ``--help``; ``--spec-types`` to choose) on a llama-server of its own, a few requests of
   each workload at 1 client; the type with the most tokens/s is that workload's
   ``llama-server n-gram`` at every level (``ngram_probe`` in the JSON);
3. closed loops at ``--clients`` (default 1, 2, 4, 8, 16, 32; ``--quick``: 1 and 4, fewer
   requests: a few minutes on 2 cores): tokens/s, TPOT p50/p95, TTFT; drafted and
   accepted tokens (sluice: ``/status.json``; llama-server: its streams' ``timings``);
4. beside each sluice row, the simulator's prediction (``sim``, ``sim_vs_measured``):
   ``sluice.sim.simulate_closed_loop`` on that server's config (its planner, TPOT target
   and speculation setting) with the cost file of that row as ``sluice costs`` writes it
   (the steps the engine ran during the row, the step-time line it had learned), its
   drafted tokens' acceptance as ``draft_acceptance``, the mean time a request spent
   outside the runtime (client TTFT less the server's, from the JSON access log) and each
   request's prompt and completion tokens from its usage (``bench.lib.simulated``).

Goals (``goals`` in the JSON, printed with the figure and by how much each is missed):
grounded at 1 client, sluice auto >= 2x sluice off and >= 1.3x llama-server's best
n-gram; auto >= 0.98x off at every level of both workloads; greedy output identical.

Writes ``bench/results/speculation.json`` and ``.png``. Run it alone on the host: the
numbers are the machine's.

    python bench/speculation.py --quick
    python bench/speculation.py                           # 1-32 clients
    python bench/speculation.py --clients 1,2,4,8,16,32 --spec-types ngram-simple,ngram-mod
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.llama_server import LLAMA_CPP_PYTHON_VERSION, llama_server_cmd
from bench.lib.llama_server import find as find_llama_server
from bench.lib.llm_runs import THREADS
from bench.lib.loadgen import percentile
from bench.lib.model_tables import BENCH_MODELS, llm_table, server_tables
from bench.lib.prompts import PROMPTS
from bench.lib.report import commit, machine, markdown_table, ms, ratio
from bench.lib.servers import free_port, running, sluice_cmd
from bench.lib.simulated import (
    access_lines,
    beside,
    err_cell,
    front_end_summary,
    point_costs,
    predict_closed_loop,
    seen_before,
)
from sluice.cli.costs import read_status
from sluice.config import Config, load_config
from sluice.sim import Arrival

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = "smollm2-135m-instruct"
SETTINGS = ("off", "auto")
OFF, AUTO, PLAIN, NGRAM = "sluice off", "sluice auto", "llama-server", "llama-server n-gram"
SYSTEMS = (OFF, AUTO, PLAIN, NGRAM)
"""The rows of every level and workload: sluice by its ``speculation`` setting,
llama-server without speculation and with the workload's best n-gram type."""
MAX_TOKENS = {"grounded": 320, "free": 128}
LEVELS = (1, 2, 4, 8, 16, 32)
QUICK_LEVELS = (1, 4)
KV_CELLS_PER_SLOT = 1024
"""sluice's packaged layout (32 slots of 1024 cells); llama-server gets as many a slot."""
NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
"""llama-server's n-gram ``--spec-type`` values in this llama.cpp version (``spec_types``
reads the ones a build accepts from its ``--help``)."""

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
    prompt_tokens: int = 0
    """The usage's prompt tokens (the chat template's included)."""
    drafted: int = 0
    accepted: int = 0
    """llama-server: its stream's draft tokens and the accepted ones (``timings``)."""


async def chat(client: httpx.AsyncClient, base: str, prompt: str, max_tokens: int,
               request_id: str | None = None) -> Reply:
    """A greedy streamed chat completion of ``prompt``: its text, usage tokens, TTFT and
    TPOT (first to last content chunk over the tokens after the first); ``request_id``
    as ``x-request-id`` (its access-log line)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    headers = {"x-request-id": request_id} if request_id else None
    t0 = time.perf_counter()
    first = last = None
    parts: list[str] = []
    tokens = prompt_tokens = drafted = accepted = 0
    try:
        async with client.stream("POST", f"{base}/v1/chat/completions", json=body,
                                 headers=headers, timeout=600.0) as resp:
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
                    prompt_tokens = int(chunk["usage"].get("prompt_tokens") or 0)
                timings = chunk.get("timings") or {}
                drafted = int(timings.get("draft_n", drafted))
                accepted = int(timings.get("draft_n_accepted", accepted))
    except (httpx.HTTPError, OSError) as exc:
        return Reply(False, error=f"{type(exc).__name__}: {exc}"[:200])
    ttft = None if first is None else first - t0
    tpot = (last - first) / (tokens - 1) if first is not None and last is not None \
        and tokens > 1 else None
    return Reply(True, "".join(parts), tokens, ttft, tpot, None, prompt_tokens, drafted,
                 accepted)


async def closed(base: str, prompts: Sequence[str], max_tokens: int, concurrency: int,
                 n_requests: int, tag: str | None = None) -> tuple[list[Reply], float]:
    """``concurrency`` clients sending back to back until ``n_requests`` are done; the
    replies in request order (request ``i`` tagged ``<tag>-<i>`` with ``tag``)."""
    todo = iter(range(n_requests))
    replies: list[Reply | None] = [None] * n_requests
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=concurrency + 2)) as c:
        async def user() -> None:
            for i in todo:
                replies[i] = await chat(c, base, prompts[i % len(prompts)], max_tokens,
                                        None if tag is None else f"{tag}-{i}")
        t0 = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(concurrency)))
        return [r for r in replies if r is not None], time.perf_counter() - t0


def drafted(status: Mapping[str, Any]) -> tuple[int, int]:
    """A sluice server's drafted and accepted tokens so far (a ``/status.json`` read)."""
    d = a = 0
    for worker in status["workers"]:
        for m in worker["models"]:
            spec = m.get("speculation") or {}
            d, a = d + spec.get("draft_tokens", 0), a + spec.get("accepted_tokens", 0)
    return d, a


def row_of(system: str, workload: str, concurrency: int, replies: Sequence[Reply],
           wall_s: float, counts: tuple[int, int], spec_type: str | None = None
           ) -> dict[str, Any]:
    """One system's closed loop at one level: tokens/s, TTFT p50/p95, TPOT p50/p95 and
    the drafted and accepted tokens (``counts``)."""
    ok = [r for r in replies if r.ok]
    tpot = [r.tpot_s for r in ok if r.tpot_s is not None]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    tokens = sum(r.tokens for r in ok)
    row: dict[str, Any] = {
        "system": system, "workload": workload, "concurrency": concurrency,
        "requests": len(replies), "errors": len(replies) - len(ok), "wall_s": round(wall_s, 3),
        "tokens": tokens, "tokens_per_s": tokens / wall_s if wall_s > 0 else 0.0,
        "ttft_p50_s": percentile(ttft, 0.5), "ttft_p95_s": percentile(ttft, 0.95),
        "tpot_p50_s": percentile(tpot, 0.5), "tpot_p95_s": percentile(tpot, 0.95),
        "draft_tokens": counts[0], "accepted_tokens": counts[1],
        "acceptance": round(counts[1] / counts[0], 3) if counts[0] else None}
    if spec_type is not None:
        row["spec_type"] = spec_type
    label = system if spec_type is None else f"{PLAIN} {spec_type}"
    print(f"  {label:25s} {workload:8s} c={concurrency:<2d} {row['tokens_per_s']:7.1f} tok/s  "
          f"tpot p50 {ms(row['tpot_p50_s'])} p95 {ms(row['tpot_p95_s'])}  drafted "
          f"{counts[0]} accepted {counts[1]}  errors {row['errors']}", flush=True)
    return row


def sluice_toml(setting: str) -> str:
    """The packaged default model as ``sluice serve`` runs it (without its first-token
    target), with ``speculation``."""
    extra = f'tpot_target_ms = 150\nstep_cost_warmup = true\nspeculation = "{setting}"'
    return (server_tables(MODEL, 64, 32, budget_bytes=4_000_000_000)
            + "\n[engine]\nmax_retained_slots = 4\n"
            + llm_table(MODEL, f"packaged:{MODEL}", n_ctx=32 * KV_CELLS_PER_SLOT,
                        n_seq_max=32, n_threads=2, extra=extra))


def spec_types(binary: Path) -> list[str]:
    """The n-gram ``--spec-type`` values ``binary`` (a llama-server) accepts, from its
    ``--help``."""
    out = subprocess.run([str(binary), "--help"], capture_output=True, text=True,
                         timeout=60).stdout
    line = next((x for x in out.splitlines() if "--spec-type" in x), "")
    found = list(dict.fromkeys(re.findall(r"ngram-[a-z0-9-]*[a-z0-9]", line)))
    if not found:
        raise RuntimeError(f"{binary} --help names no --spec-type ngram-* value")
    return found


def llama_cmd(binary: Path, gguf: Path, port: int, slots: int,
              spec_type: str | None) -> list[str]:
    """llama-server on ``gguf``: ``slots`` slots of ``KV_CELLS_PER_SLOT`` cells, and
    ``--spec-type spec_type`` (its own draft lengths) unless ``None``."""
    cmd = llama_server_cmd(binary, gguf, port, n_ctx=slots * KV_CELLS_PER_SLOT,
                           n_slots=slots, threads=THREADS)
    return cmd if spec_type is None else [*cmd, "--spec-type", spec_type]


def greedy_texts(base: str, prompts: Sequence[str], max_tokens: int) -> list[str]:
    """Each prompt sent alone: its greedy text."""
    async def alone() -> list[Reply]:
        async with httpx.AsyncClient() as c:
            return [await chat(c, base, p, max_tokens) for p in prompts]
    return [r.text for r in asyncio.run(alone())]


def same_output(bases: Mapping[str, str], quick: bool) -> dict[str, Any]:
    """Each workload's prompts (every fourth with ``quick``) sent alone to every server:
    how many texts are the same as sluice off's."""
    out: dict[str, Any] = {}
    for workload, prompts in WORKLOADS.items():
        chosen = list(prompts[:: 4 if quick else 1])
        texts = {s: greedy_texts(base, chosen, MAX_TOKENS[workload])
                 for s, base in bases.items()}
        out[workload] = {"prompts": len(chosen), "identical_to_sluice_off": {
            s: sum(a == b for a, b in zip(texts[OFF], t, strict=True))
            for s, t in texts.items() if s != OFF}}
        print(f"  {workload}: of {len(chosen)} greedy outputs, the same as sluice off's: "
              f"{out[workload]['identical_to_sluice_off']}", flush=True)
    return out


def probe_ngram(binary: Path, gguf: Path, types: Sequence[str], slots: int,
                n_requests: int) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Each n-gram type on a llama-server of its own, ``n_requests`` of each workload at
    1 client: the rows, and each workload's type with the most tokens/s."""
    rows: list[dict[str, Any]] = []
    for spec_type in types:
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        with running(llama_cmd(binary, gguf, port, slots, spec_type), f"{base}/health",
                     log_path=RESULTS / ".speculation_probe.log"):
            for workload, prompts in WORKLOADS.items():
                replies, wall = asyncio.run(closed(base, prompts, MAX_TOKENS[workload], 1,
                                                   n_requests))
                rows.append(row_of(NGRAM, workload, 1, replies, wall, llama_counts(replies),
                                   spec_type))
    best = {w: max((r for r in rows if r["workload"] == w),
                   key=lambda r: r["tokens_per_s"])["spec_type"] for w in WORKLOADS}
    print(f"  best n-gram type per workload: {best}", flush=True)
    return rows, best


def llama_counts(replies: Sequence[Reply]) -> tuple[int, int]:
    return sum(r.drafted for r in replies), sum(r.accepted for r in replies)


@dataclass
class SluiceServer:
    """A running sluice server of one ``speculation`` setting: its URL, config and log."""

    base: str
    config: Config
    log: Path


def measure_sluice(server: SluiceServer, system: str, workload: str, clients: int,
                   n_requests: int, tag: str) -> dict[str, Any]:
    """One sluice row, with the simulator's prediction of it beside (module docstring)."""
    before = read_status(server.base)
    replies, wall = asyncio.run(closed(server.base, WORKLOADS[workload], MAX_TOKENS[workload],
                                       clients, n_requests, tag))
    after = read_status(server.base)
    d0, a0 = drafted(before)
    d1, a1 = drafted(after)
    row = row_of(system, workload, clients, replies, wall, (d1 - d0, a1 - a0))
    time.sleep(0.5)  # the last access lines
    front = front_end_summary(replies, access_lines(server.log, tag))
    acceptance = (a1 - a0) / (d1 - d0) if system == AUTO and d1 > d0 else None
    costs = point_costs(before, after, MODEL, overhead_s=front["front_s"]["mean"],
                        acceptance=acceptance)
    prompts = WORKLOADS[workload]
    requests = [Arrival(0.0, MODEL, prompt_tokens=r.prompt_tokens or 1,
                        output_tokens=r.tokens if r.ok and r.tokens else MAX_TOKENS[workload],
                        prefix_id=i % len(prompts), prefix_tokens=r.prompt_tokens)
                for i, r in enumerate(replies)]
    sim = predict_closed_loop(server.config, costs, MODEL, requests, clients,
                              warm=seen_before(requests))  # each prompt ran alone first
    row.update(sim=sim, sim_inputs={"front_end": front, "costs": costs[MODEL]},
               sim_vs_measured=beside(row, sim))
    return row


def measure_llama(base: str, system: str, workload: str, clients: int, n_requests: int,
                  spec_type: str | None) -> dict[str, Any]:
    replies, wall = asyncio.run(closed(base, WORKLOADS[workload], MAX_TOKENS[workload],
                                       clients, n_requests))
    return row_of(system, workload, clients, replies, wall, llama_counts(replies), spec_type)


def find(rows: Sequence[Mapping[str, Any]], system: str, workload: str, clients: int
         ) -> Mapping[str, Any] | None:
    return next((r for r in rows if r["system"] == system and r["workload"] == workload
                 and r["concurrency"] == clients), None)


def goal(value: float | None, bound: float, at_least: bool = True) -> dict[str, Any]:
    """A goal's figure, bound, whether met and, when not, by how much it is missed."""
    met = value is not None and (value >= bound if at_least else value <= bound)
    return {"value": value, "bound": bound, "met": met,
            "missed_by": None if met or value is None else round(abs(value - bound), 3)}


def goals(rows: Sequence[Mapping[str, Any]], identical: Mapping[str, Any]) -> dict[str, Any]:
    """The issue's goals (module docstring), each with ``goal``'s fields."""
    def tps(system: str, workload: str, clients: int) -> float | None:
        r = find(rows, system, workload, clients)
        return None if r is None else r["tokens_per_s"]

    out: dict[str, Any] = {}
    if find(rows, AUTO, "grounded", 1) is not None:
        auto = tps(AUTO, "grounded", 1)
        out["grounded_1_client_auto_vs_off"] = goal(ratio(auto, tps(OFF, "grounded", 1)), 2.0)
        ngram = find(rows, NGRAM, "grounded", 1)
        out["grounded_1_client_auto_vs_llama_server_best_ngram"] = goal(
            ratio(auto, tps(NGRAM, "grounded", 1)), 1.3)
        if ngram is not None:
            out["grounded_1_client_auto_vs_llama_server_best_ngram"]["spec_type"] = \
                ngram.get("spec_type")
    for r in rows:
        if r["system"] == AUTO:
            w, c = r["workload"], r["concurrency"]
            out[f"{w}_{c}_clients_auto_vs_off"] = goal(
                ratio(r["tokens_per_s"], tps(OFF, w, c)), 0.98)
    for workload, same in identical.items():
        n = same["identical_to_sluice_off"].get(AUTO)
        out[f"{workload}_greedy_identical"] = goal(n, same["prompts"])
    return out


def goals_text(goals_: Mapping[str, Any]) -> str:
    lines = []
    for name, g in goals_.items():
        state = "met" if g["met"] else (
            "no figure" if g["missed_by"] is None else f"MISSED by {g['missed_by']}")
        lines.append(f"  {name}: {g['value']} (bound {g['bound']}) {state}")
    return "goals:\n" + "\n".join(lines)


def table(rows: list[dict[str, Any]]) -> str:
    """Per workload and level: each system's tokens/s and TPOT p50 / p95, and auto's
    ratios to sluice off and to llama-server's n-gram."""
    body = []
    for r in rows:
        if r["system"] != AUTO:
            continue
        w, c = r["workload"], r["concurrency"]
        off, plain, ngram = (find(rows, s, w, c) for s in (OFF, PLAIN, NGRAM))

        def tok(x: Mapping[str, Any] | None) -> str:
            return "-" if x is None else f"{x['tokens_per_s']:.1f}"

        def tpot(x: Mapping[str, Any] | None) -> str:
            return "-" if x is None else (f"{ms(x['tpot_p50_s']).strip()} / "
                                          f"{ms(x['tpot_p95_s']).strip()}")

        def times(a: Mapping[str, Any], b: Mapping[str, Any] | None) -> str:
            v = None if b is None else ratio(a["tokens_per_s"], b["tokens_per_s"])
            return "-" if v is None else f"**{v:.2f}×**"
        body.append([w, str(c), tok(off), tok(r), times(r, off), tok(plain),
                     "-" if ngram is None else f"{tok(ngram)} ({ngram.get('spec_type')})",
                     times(r, ngram), tpot(off), tpot(r), tpot(plain), tpot(ngram),
                     "-" if r["acceptance"] is None else f"{r['acceptance']:.2f}"])
    return markdown_table(["workload", "clients", "off tok/s", "auto tok/s", "auto / off",
                           "llama-server tok/s", "llama-server n-gram tok/s",
                           "auto / n-gram", "TPOT p50/p95 off", "auto", "llama-server",
                           "n-gram", "auto acceptance"], body)


def sim_table(rows: list[dict[str, Any]]) -> str:
    """Per sluice row: each predicted figure measured / simulated (relative error)."""
    body = []
    for r in rows:
        c = r.get("sim_vs_measured")
        if c is None:
            continue
        body.append([r["system"], r["workload"], str(r["concurrency"]),
                     f"{r['tokens_per_s']:.1f} / " + err_cell(c, "tokens_per_s"),
                     f"{ms(r['ttft_p95_s']).strip()} / " + err_cell(c, "ttft_p95_s", 1000, 0),
                     f"{ms(r['tpot_p95_s']).strip()} / " + err_cell(c, "tpot_p95_s", 1000, 0)])
    return markdown_table(["system", "workload", "clients", "tok/s measured / simulated (err)",
                           "TTFT p95 ms measured / simulated", "TPOT p95 ms measured / simulated"],
                          body)


def parse_list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def parse_levels(text: str) -> list[int]:
    """``1,2,4`` → ``[1, 2, 4]``: client counts, each >= 1."""
    try:
        levels = [int(x) for x in parse_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--clients: {text!r} is not a list of integers "
                                         f"such as 1,2,4,8,16,32") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"--clients: want client counts >= 1, got {text!r}")
    return levels


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"clients {','.join(map(str, QUICK_LEVELS))}, fewer requests and "
                        "probe requests (a few minutes)")
    parser.add_argument("--clients", type=parse_levels, default=None,
                        help=f"client counts to run (default {','.join(map(str, LEVELS))})")
    parser.add_argument("--out", type=Path, default=RESULTS / "speculation.json",
                        help="the JSON to write (the PNG goes beside it)")
    parser.add_argument("--requests", type=int, default=None,
                        help="requests per level and system instead of the default")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="new tokens a request instead of each workload's default")
    parser.add_argument("--spec-types", type=parse_list, default=None,
                        help="llama-server n-gram types to probe (default: every one the "
                        "build accepts); one type: no probe, that type for both workloads")
    parser.add_argument("--probe-requests", type=int, default=None,
                        help="requests of each workload per n-gram type in the probe "
                        "(default 4; --quick 2)")
    parser.add_argument("--workloads", type=parse_list, default=None,
                        help=f"the workloads to run (default {','.join(WORKLOADS)})")
    parser.add_argument("--no-llama-server", action="store_true",
                        help="sluice off and auto only (no peer: a check of sluice alone)")
    args = parser.parse_args(argv)
    levels = args.clients or list(QUICK_LEVELS if args.quick else LEVELS)
    if args.max_tokens is not None:
        MAX_TOKENS.update(dict.fromkeys(MAX_TOKENS, args.max_tokens))
    if args.workloads is not None:
        unknown = [w for w in args.workloads if w not in WORKLOADS]
        if unknown or not args.workloads:
            parser.error(f"--workloads: {unknown} unknown (known: {', '.join(WORKLOADS)})")
        for w in [w for w in WORKLOADS if w not in args.workloads]:
            del WORKLOADS[w]
    t_start = time.time()
    rows: list[dict[str, Any]] = []
    probe: list[dict[str, Any]] = []
    best: dict[str, str] = {}
    slots = max(levels)
    RESULTS.mkdir(parents=True, exist_ok=True)
    peer: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        servers: dict[str, SluiceServer] = {}
        bases: dict[str, str] = {}
        for setting, system in zip(SETTINGS, (OFF, AUTO), strict=True):
            port = free_port()
            cmd, cfg_path = sluice_cmd(sluice_toml(setting), port)
            log = RESULTS / f"speculation_{setting}.log"
            base = f"http://127.0.0.1:{port}"
            stack.enter_context(running([*cmd, "--log-level", "info", "--log-format", "json"],
                                        f"{base}/ready", log_path=log))
            servers[system] = SluiceServer(base, load_config(cfg_path), log)
            bases[system] = base
        llama: dict[str, str] = {}  # system label (PLAIN or a spec type) → URL
        if not args.no_llama_server:
            binary = find_llama_server()
            gguf = BENCH_MODELS[MODEL][1]()
            accepted = spec_types(binary)
            types = args.spec_types or accepted
            unknown = [t for t in types if t not in accepted]
            if unknown:
                raise SystemExit(f"--spec-types: {unknown} not accepted by {binary} "
                                 f"(it takes {accepted})")
            peer = {"binary": str(binary), "llama_cpp_python": LLAMA_CPP_PYTHON_VERSION,
                    "accepted_spec_types": accepted, "slots": slots,
                    "kv_cells": slots * KV_CELLS_PER_SLOT,
                    "command": llama_cmd(binary, gguf, 0, slots, None)[1:]}
            if len(types) > 1:
                print(f"n-gram probe, 1 client: {types}", flush=True)
                probe, best = probe_ngram(binary, gguf, types, slots, args.probe_requests
                                          or (2 if args.quick else 4))
            else:
                best = dict.fromkeys(WORKLOADS, types[0])
            for label, spec_type in ((PLAIN, None), *((t, t) for t in
                                                      dict.fromkeys(best.values()))):
                port = free_port()
                llama[label] = f"http://127.0.0.1:{port}"
                stack.enter_context(running(llama_cmd(binary, gguf, port, slots, spec_type),
                                            f"{llama[label]}/health",
                                            log_path=RESULTS / f".speculation_{label}.log"))
            bases[PLAIN] = llama[PLAIN]
            for spec_type in best.values():
                bases.setdefault(f"{NGRAM} {spec_type}", llama[spec_type])
        print("greedy output, each prompt alone", flush=True)
        identical = same_output(bases, args.quick)
        print(f"closed loop, {MODEL}", flush=True)
        systems = [s for s in SYSTEMS if s in servers or (llama and s in (PLAIN, NGRAM))]
        for i, c in enumerate(levels):
            order = systems[i % len(systems):] + systems[:i % len(systems)]
            for workload in WORKLOADS:
                n = args.requests or (max(2, c) if args.quick else max(4, 2 * c))
                for system in order:
                    if system in servers:
                        tag = f"{workload}-c{c}"
                        rows.append(measure_sluice(servers[system], system, workload, c, n,
                                                   tag))
                    elif system == PLAIN:
                        rows.append(measure_llama(llama[PLAIN], PLAIN, workload, c, n, None))
                    else:
                        t = best[workload]
                        rows.append(measure_llama(llama[t], NGRAM, workload, c, n, t))
    result: dict[str, Any] = {
        "benchmark": "speculation", "quick": args.quick, "model": MODEL,
        "max_tokens": MAX_TOKENS, "levels": levels, "identical_outputs": identical,
        "llama_server": peer, "ngram_probe": probe, "best_ngram": best,
        "machine": machine(), "commit": commit(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t_start)), "rows": rows,
        "goals": goals(rows, identical),
    }
    result["duration_s"] = round(time.time() - t_start, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    plot(result, args.out.with_suffix(".png"))
    print()
    print(table(rows))
    print()
    print(sim_table(rows))
    print()
    print(goals_text(result["goals"]))
    print(f"\nwrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    workloads = list(WORKLOADS)
    fig, axes = plt.subplots(2, len(workloads), figsize=(6.5 * len(workloads), 8),
                             squeeze=False)
    colors = dict(zip(SYSTEMS, ("#4c72b0", "#55a868", "#dd8452", "#c44e52"), strict=True))
    for j, workload in enumerate(workloads):
        for system in SYSTEMS:
            mine = sorted((r for r in rows if r["system"] == system
                           and r["workload"] == workload), key=lambda r: r["concurrency"])
            if not mine:
                continue
            label = system if system != NGRAM else \
                f"{PLAIN} {result['best_ngram'].get(workload, '')}"
            x = [r["concurrency"] for r in mine]
            color = colors[system]
            axes[0][j].plot(x, [r["tokens_per_s"] for r in mine], marker="o", color=color,
                            label=label)
            if any("sim" in r for r in mine):
                axes[0][j].plot(x, [r.get("sim", {}).get("tokens_per_s") or 0 for r in mine],
                                marker="x", linestyle=":", color=color,
                                label=f"{label}, simulated")
            axes[1][j].plot(x, [(r["tpot_p50_s"] or 0) * 1000 for r in mine], marker="o",
                            color=color, label=f"{label} p50")
            axes[1][j].plot(x, [(r["tpot_p95_s"] or 0) * 1000 for r in mine], marker="x",
                            linestyle="--", color=color, label=f"{label} p95")
        axes[0][j].set(xscale="log", xlabel="concurrent clients", ylabel="generated tokens/s",
                       title=f"{workload}: throughput")
        axes[1][j].set(xscale="log", xlabel="concurrent clients", ylabel="TPOT (ms)",
                       title=f"{workload}: time per output token")
        for ax in (axes[0][j], axes[1][j]):
            ax.set_xticks(result["levels"], labels=[str(c) for c in result["levels"]])
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle(f"n-gram speculation: sluice off / auto and llama-server\n{result['model']} "
                 f"({result['started'][:10]})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
