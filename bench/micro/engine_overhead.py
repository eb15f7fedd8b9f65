"""Python per step: the continuous engine against the bare backend loop at the same batch.

For each batch size B: the bare loop feeds B one-token chunks per ``forward`` (no engine:
the ceiling); the engine runs B greedy requests of ``--tokens`` new tokens (EOS ignored,
no HTTP) through plan → apply → forward → choose → stream. Both in one process, on the
same model, interleaved twice; the steady-state decode rate of each is compared. With
``--py-spy`` the engine runs again under py-spy (``py-spy record``), writing a flame
graph SVG, to show where the engine's own time goes.

    python bench/micro/engine_overhead.py          # about 2 min
    python bench/micro/engine_overhead.py --py-spy

``--closed B`` asks where a plain ``sluice serve`` loses against the bare loop at B
clients: Gemma 3 270M as ``default_config()`` loads it (32 slots of 1024 cells, 4
retained prefixes, the TPOT target), three ways interleaved ``--rounds`` times (the order
rotated each round): the bare loop doing the same work (``bare_closed_tokens_per_s``: the
same prompts, prefill, new tokens and refills, on slots 0..B-1; the older short-context
loop without prefill is kept beside it as ``bare_short_tokens_per_s``); the engine in
this process with B closed-loop clients (a request replaced the moment one ends, 128 new
tokens, the benchmark's prompts), recording each decode step's slot span (highest slot -
lowest + 1: llama.cpp attends over every stream in that range); and the server over HTTP
with B streaming clients, with the CPU it and its event loop spent a token. Writes
bench/results/engine_overhead_closed.json (``_c{B}`` in the name when B is not 8).

    python bench/micro/engine_overhead.py --closed 8 --requests 24

``--servers server,server_loop_nice,...`` runs the server's load several ways a round
(``SERVER_VARIANTS``: its event loop or the clients at another nice, the clients on
uvloop, lean (``bench/lib/sse_client.py``) or burning extra CPU, whole answers instead of
streams, another ``GOMP_SPINCOUNT``), each server run with the
runnable-but-waiting time of its threads (``thread_wait_ms_per_token``: the event loop,
then the busiest threads, llama.cpp's compute threads first); ``--suffix`` names the files.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httpx
import numpy as np
import uvloop

from bench.lib.loadgen import Sample, closed_loop
from bench.lib.model_tables import GEMMA as MODEL
from bench.lib.prompts import PROMPTS
from bench.lib.servers import (
    free_port,
    niced,
    process_cpu_s,
    process_schedstat,
    running,
    thread_cpu_s,
    thread_nice,
    thread_wait_s,
)
from sluice.backends.base import ForwardChunk, ModelSpec
from sluice.backends.llamacpp import LlamaCppBackend, LlamaCppGenerative
from sluice.backends.packaged import GEMMA_MODEL_ID
from sluice.config import default_config
from sluice.engine.continuous import ContinuousEngine, EngineConfig
from sluice.engine.request import Request, SamplingParams

RESULTS = Path(__file__).resolve().parents[1] / "results"
PROMPT = "Once upon a time there was a lighthouse keeper who"


def load(n_seq_max: int) -> LlamaCppGenerative:
    spec = ModelSpec("g", "generative", "llamacpp", 1, options={
        "path": "packaged:gemma-3-270m", "n_ctx": 8192, "n_seq_max": n_seq_max,
        "n_threads": 2})
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


def bare_closed_tokens_per_s(model: LlamaCppGenerative, clients: int, n_requests: int,
                             max_tokens: int) -> float:
    """The engine's closed-loop work with no engine: ``forward`` calls only.

    Slots 0 .. clients-1 each run a request of the benchmark's prompts (in the engine
    run's order): one step prefills its prompt (that step's logits give the first token),
    then one-token decodes until ``max_tokens``; a slot whose request ends takes the next
    request at once, its prefill in the same ``forward`` as the others' decodes. So the
    contexts, prefill and batch shapes are the engine run's; what is missing is only the
    Python around the passes (planning, choosing and streaming tokens). The fed token is
    the prompt's last (the decode's cost does not depend on which token it is; no argmax).
    Tokens/s over the whole run, prefill steps included, as ``engine_closed_loop``."""
    prompts = [tuple(model.tokenize(p, add_bos=True)) for p in PROMPTS]
    for slot in range(model.n_seq_max):
        model.release_sequence(slot)
    # per slot: [prompt, tokens generated, KV length] (None: idle)
    state: list[list[Any] | None] = [None] * clients
    sent = done_tokens = 0
    t0 = time.perf_counter()
    for slot in range(min(clients, n_requests)):
        state[slot] = [prompts[sent % len(prompts)], 0, 0]
        sent += 1
    while any(st is not None for st in state):
        chunks = []
        for slot, st in enumerate(state):
            if st is None:
                continue
            prompt, _, kv_len = st
            chunks.append(ForwardChunk(slot, prompt, 0, True) if kv_len == 0
                          else ForwardChunk(slot, (prompt[-1],), kv_len, True))
        model.forward(chunks)
        for chunk in chunks:
            st = state[chunk.seq_slot]
            assert st is not None
            st[1] += 1
            st[2] += len(chunk.tokens)
            if st[1] == max_tokens:
                done_tokens += max_tokens
                model.release_sequence(chunk.seq_slot)
                if sent < n_requests:
                    state[chunk.seq_slot] = [prompts[sent % len(prompts)], 0, 0]
                    sent += 1
                else:
                    state[chunk.seq_slot] = None
    return done_tokens / (time.perf_counter() - t0)


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


def default_model() -> tuple[LlamaCppGenerative, EngineConfig]:
    """Gemma 3 270M and the engine settings exactly as a plain ``sluice serve`` has them."""
    config = default_config()
    [gemma] = [m for m in config.models if m.id == GEMMA_MODEL_ID]
    model = LlamaCppBackend().load(gemma.spec())
    assert isinstance(model, LlamaCppGenerative)
    return model, config.runtime_config().workers[0].engine


def engine_closed_loop(model: LlamaCppGenerative, config: EngineConfig, clients: int,
                       n_requests: int, max_tokens: int) -> dict[str, Any]:
    """``clients`` closed-loop clients straight into the engine (no HTTP): tokens/s over
    the run, and the decode steps' batch sizes, slot spans and seconds."""
    engine = ContinuousEngine(model, config, time.monotonic, lambda r: None)
    prompts = [tuple(model.tokenize(p, add_bos=True)) for p in PROMPTS]
    steps: list[tuple[int, int, float]] = []
    forward = model.forward

    def traced(chunks: Any) -> Any:
        t = time.perf_counter()
        out = forward(chunks)
        if all(len(c.tokens) == 1 for c in chunks):
            slots = [c.seq_slot for c in chunks]
            steps.append((len(slots), max(slots) - min(slots) + 1, time.perf_counter() - t))
        return out

    model.forward = traced  # type: ignore[method-assign]
    sent = 0
    live: list[Request] = []

    def send() -> None:
        nonlocal sent
        req = Request(request_id=sent + 1, model_id="g", kind="generative",
                      arrival_s=time.monotonic(), prompt_tokens=prompts[sent % len(prompts)],
                      params=SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                            ignore_eos=True))
        req.mark_queued(time.monotonic())
        engine.add(req)
        live.append(req)
        sent += 1

    try:
        t0 = time.perf_counter()
        for _ in range(min(clients, n_requests)):
            send()
        tokens = 0
        while engine.has_work:
            engine.step()
            for req in [r for r in live if r.is_terminal]:
                live.remove(req)
                tokens += max_tokens
                if sent < n_requests:
                    send()
        wall = time.perf_counter() - t0
    finally:
        del model.forward
    for s in range(model.n_seq_max):
        model.release_sequence(s)
    full = [st for st in steps if st[0] == clients]
    return {"tokens_per_s": tokens / wall, "decode_steps": len(steps),
            "slot_moves": engine.slot_moves,
            "full_batch_steps": len(full),
            "mean_span_full": float(np.mean([st[1] for st in full])) if full else None,
            "mean_step_ms_full": 1000 * float(np.mean([st[2] for st in full])) if full
            else None,
            "span_hist": {str(k): sum(1 for st in full if st[1] == k)
                          for k in sorted({st[1] for st in full})},
            # decode steps by batch size: how many, and their median forward ms
            "decode_batches": {str(b): [sum(1 for st in steps if st[0] == b), round(
                1000 * float(np.median([st[2] for st in steps if st[0] == b])), 1)]
                for b in sorted({st[0] for st in steps})}}


@dataclass(frozen=True)
class ServerRun:
    """One way of running the server's load: what is changed for the run, or, for
    ``env``, in the server process it runs against (one process per distinct ``env``)."""

    label: str
    loop_nice: int | None = None
    """The server's event-loop thread (its main thread) at this nice for the run."""
    client_nice: int | None = None
    """The load generator's thread (this process's main thread) at this nice."""
    client_uvloop: bool = False
    """The load generator's event loop is uvloop's (the server's already is)."""
    client_raw: bool = False
    """The load generator reads through ``bench.lib.sse_client`` (no httpx) on uvloop."""
    stream: bool = True
    """False: the clients ask for whole answers (``stream: false``), so nothing is sent or
    parsed a token: the server's loop and the clients leave the compute threads alone
    until a request ends."""
    client_burn_ms: float = 0.0
    """CPU milliseconds the load generator burns after each token arrives: a known extra
    load beside the server, to measure what a millisecond of it costs a step."""
    env: tuple[tuple[str, str], ...] = ()
    """Environment of the server process (``GOMP_SPINCOUNT``: how long llama.cpp's OpenMP
    compute threads spin before sleeping, 300,000 by default: 10-20 ms here)."""


SERVER_VARIANTS: dict[str, ServerRun] = {
    "server": ServerRun("server (HTTP)"),
    "server_loop_nice": ServerRun("server,\nloop nice 10", loop_nice=10),
    "server_client_nice": ServerRun("server,\nclients nice 10", client_nice=10),
    "server_both_nice": ServerRun("server, loop\n+ clients nice 10", loop_nice=10,
                                  client_nice=10),
    "server_uvloop_clients": ServerRun("server,\nclients on uvloop", client_uvloop=True),
    "server_spin10k": ServerRun("server,\nGOMP_SPINCOUNT=10k",
                                env=(("GOMP_SPINCOUNT", "10000"),)),
    "server_spin2k": ServerRun("server,\nGOMP_SPINCOUNT=2k",
                               env=(("GOMP_SPINCOUNT", "2000"),)),
    "server_raw_clients": ServerRun("server, lean clients\n(sse_client, uvloop)",
                                    client_raw=True, client_uvloop=True),
    "server_whole_answers": ServerRun("server, whole answers\n(no streaming)",
                                      stream=False),
    "server_client_burn": ServerRun("server, clients\n+0.25 ms CPU a token",
                                    client_burn_ms=0.25),
}
"""The server over HTTP, and with one thing changed: does a third runnable thread beside
llama.cpp's two compute threads (2 cores, a barrier every layer) delay whole steps?"""


def server_closed_loop(base: str, clients: int, n_requests: int, max_tokens: int,
                       server_pid: int | None = None,
                       how: ServerRun | None = None) -> dict[str, Any]:
    """Tokens/s of ``clients`` streaming clients; with ``server_pid`` also the CPU
    milliseconds a token of the server process (all its threads) and of the clients (this
    process: the load generator), and the milliseconds a token its threads were runnable
    but waiting for a CPU (by thread: ``thread_wait_ms_per_token``). ``how`` the run is
    changed (nice values are set back after); None: as started."""
    how = how or SERVER_VARIANTS["server"]
    server_cpu = process_cpu_s(server_pid) if server_pid is not None else 0.0
    threads = thread_cpu_s(server_pid) if server_pid is not None else {}
    wait_s = process_schedstat(server_pid)[1] if server_pid is not None else 0.0
    waits = thread_wait_s(server_pid) if server_pid is not None else {}
    client_cpu = time.process_time()
    with niced(server_pid or 0, how.loop_nice if server_pid else None), \
            niced(threading.get_native_id(), how.client_nice):
        nices = ([thread_nice(server_pid)] if server_pid else []) + [
            thread_nice(threading.get_native_id())]
        load = closed_loop(
            base, MODEL, PROMPTS, concurrency=clients, n_requests=n_requests,
            max_tokens=max_tokens, raw_client=how.client_raw,
            on_token=burner(how.client_burn_ms) if how.client_burn_ms else None,
        ) if how.stream else whole_answers(base, clients, n_requests, max_tokens)
        samples, wall = uvloop.run(load) if how.client_uvloop else asyncio.run(load)
    client_cpu = time.process_time() - client_cpu
    ok = [s for s in samples if s.ok]
    tokens = sum(s.tokens for s in ok)
    tpots = sorted(s.tpot_s for s in ok if s.tpot_s is not None)
    out: dict[str, Any] = {
        "tokens_per_s": tokens / wall, "errors": len(samples) - len(ok),
        "tpot_p50_ms": 1000 * tpots[len(tpots) // 2] if tpots else None,
        "client_cpu_ms_per_token": 1000 * client_cpu / max(1, tokens),
        "nice_loop_clients": nices}
    if server_pid is not None:
        out["cpu_ms_per_token"] = 1000 * (process_cpu_s(server_pid) - server_cpu) / max(1, tokens)
        out["cpu_wait_ms_per_token"] = round(
            1000 * (process_schedstat(server_pid)[1] - wait_s) / max(1, tokens), 3)
        # the main thread is uvicorn's event loop (HTTP, SSE framing); the other threads,
        # busiest first: the worker (the engine's Python and its share of each pass) and
        # llama.cpp's compute threads
        after = thread_cpu_s(server_pid)
        used = {tid: 1000 * (after[tid] - threads.get(tid, 0.0)) / max(1, tokens)
                for tid in after}
        out["event_loop_cpu_ms_per_token"] = round(used.pop(server_pid, 0.0), 3)
        out["other_threads_cpu_ms_per_token"] = sorted(
            (round(v, 3) for v in used.values() if v > 0), reverse=True)
        # runnable-but-waiting ms a token: the event loop, then the threads busiest first
        # (the worker and llama.cpp's other compute thread: a wait there holds a step)
        waited = thread_wait_s(server_pid)
        wait_ms = {tid: 1000 * (waited[tid] - waits.get(tid, 0.0)) / max(1, tokens)
                   for tid in waited}
        busiest = sorted(used, key=lambda tid: -used[tid])
        out["thread_wait_ms_per_token"] = [round(wait_ms.get(server_pid, 0.0), 3)] + [
            round(wait_ms.get(tid, 0.0), 3) for tid in busiest[:3]]
    return out


async def whole_answers(base: str, clients: int, n_requests: int, max_tokens: int
                        ) -> tuple[list[Sample], float]:
    """``closed_loop`` asking for whole answers (no SSE): a sample's tokens are the
    answer's ``usage.completion_tokens``, its latency the request's (no TTFT/TPOT)."""
    counter = iter(range(n_requests))
    samples: list[Sample] = []
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=clients + 4),
                                 timeout=300.0) as client:

        async def user() -> None:
            for i in counter:
                t0 = time.perf_counter()
                resp = await client.post(f"{base}/v1/completions", json={
                    "model": MODEL, "prompt": PROMPTS[i % len(PROMPTS)],
                    "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True})
                ok = resp.status_code == 200
                samples.append(Sample(
                    status=resp.status_code, start_s=t0, latency_s=time.perf_counter() - t0,
                    tokens=resp.json()["usage"]["completion_tokens"] if ok else 0,
                    error=None if ok else resp.text[:200]))

        t0 = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(clients)))
        return samples, time.perf_counter() - t0


def burner(ms: float) -> Callable[[], None]:
    """A function that keeps this thread's CPU busy for ``ms`` milliseconds."""
    def burn() -> None:
        end = time.thread_time() + ms / 1000
        while time.thread_time() < end:
            pass
    return burn


def with_cpu(run: Callable[[], Any], tokens: int) -> tuple[Any, float]:
    """``run()``'s result and the CPU milliseconds a token this process spent on it (every
    thread: llama.cpp's compute threads included)."""
    cpu = time.process_time()
    out = run()
    return out, 1000 * (time.process_time() - cpu) / tokens


def compute_wait(run: Callable[[], Any], tokens: int) -> tuple[Any, list[float]]:
    """``run()``'s result and the milliseconds a token this process's two busiest threads
    (llama.cpp's compute threads: this thread and its OpenMP worker thread) were runnable but
    waiting for a CPU: the in-process baseline of the server's ``thread_wait_ms_per_token``."""
    pid = os.getpid()
    cpu0, wait0 = thread_cpu_s(pid), thread_wait_s(pid)
    out = run()
    cpu1, wait1 = thread_cpu_s(pid), thread_wait_s(pid)
    busiest = sorted(cpu1, key=lambda tid: cpu0.get(tid, 0.0) - cpu1[tid])[:2]
    return out, [round(1000 * (wait1[t] - wait0.get(t, 0.0)) / tokens, 3) for t in busiest]


def _rate_of(name: str) -> Callable[[dict[str, Any]], float]:
    return lambda row: float(row[name]["tokens_per_s"])


def plot_closed(result: dict[str, Any], path: Path) -> None:
    """Tokens/s of the bare loop, the engine (retaining prefixes, and not) and the server
    runs, each round side by side, with each system's median over its round's bare loop."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = result["rounds"]
    systems: dict[str, Callable[[dict[str, Any]], float]] = {
               "bare loop": lambda r: r["bare_tokens_per_s"],
               **({"bare, short (old)": lambda r: r["bare_short_tokens_per_s"]}
                  if "bare_short_tokens_per_s" in rounds[0] else {}),
               "engine": lambda r: r["engine"]["tokens_per_s"],
               **({"engine, no retained": lambda r: r["engine_retain0"]["tokens_per_s"]}
                  if "engine_retain0" in rounds[0] else {}),
               **{SERVER_VARIANTS[name].label: _rate_of(name)
                  for name in SERVER_VARIANTS if name in rounds[0]}}
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.8 / len(rounds)
    for i, row in enumerate(rounds):
        ax.bar([k + (i - (len(rounds) - 1) / 2) * width for k in range(len(systems))],
               [f(row) for f in systems.values()], width=width, label=f"round {row['round']}")
    ax.set_xticks(range(len(systems)), [
        f"{name}\n{np.median([f(r) / r['bare_tokens_per_s'] for r in rounds]):.2f}x bare"
        for name, f in systems.items()])
    ax.set_ylabel("tokens/s")
    ax.set_title(f"{result['clients']} closed-loop clients, {result['max_tokens']} tokens a "
                 "request (rotated rounds; median of each round over its bare loop)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def closed_main(clients: int, n_requests: int, max_tokens: int, retain0: bool = False,
                spy_path: Path | None = None, n_rounds: int = 3,
                servers: tuple[str, ...] = ("server",), stem_suffix: str = "",
                first_round: int = 0) -> int:
    """Bare loop, engine and server at ``clients``, interleaved ``n_rounds`` times, the
    order rotated each round (see the module); each with its CPU milliseconds a token.
    ``servers`` names the server runs of each round (``SERVER_VARIANTS``: the same server
    process, its event loop or the clients at another nice).
    ``retain0`` adds the engine with no retained prefixes; ``spy_path`` then runs the
    server's load once more under ``py-spy record`` (raw collapsed stacks, 50 Hz, one
    stack a thread) attached to the server's process."""
    model, config = default_model()
    rounds: list[dict[str, Any]] = []
    t0 = time.time()
    with contextlib.ExitStack() as stack:
        procs: dict[tuple[tuple[str, str], ...], tuple[str, int]] = {}
        for env in dict.fromkeys(SERVER_VARIANTS[name].env for name in ("server", *servers)):
            port = free_port()
            cmd = [sys.executable, "-m", "sluice.cli", "serve", "--port", str(port),
                   "--log-level", "warning"]
            proc = stack.enter_context(running(cmd, f"http://127.0.0.1:{port}/ready",
                                               env=dict(env)))
            procs[env] = (f"http://127.0.0.1:{port}", proc.pid)
            server_closed_loop(procs[env][0], 1, 1, 8)  # warm-up
        base, server_pid = procs[()]
        tokens = n_requests * max_tokens
        for r in range(first_round, first_round + n_rounds):
            row: dict[str, Any] = {"round": r}

            def bare(row: dict[str, Any]) -> None:
                (row["bare_tokens_per_s"], row["bare_cpu_ms_per_token"]), \
                    row["bare_wait_ms_per_token"] = compute_wait(lambda: with_cpu(
                        lambda: bare_closed_tokens_per_s(model, clients, n_requests,
                                                         max_tokens), tokens), tokens)
                row["bare_short_tokens_per_s"] = bare_tokens_per_s(model, clients,
                                                                   max_tokens // 2)

            def engine(row: dict[str, Any]) -> None:
                (row["engine"], cpu), wait = compute_wait(lambda: with_cpu(
                    lambda: engine_closed_loop(model, config, clients, n_requests, max_tokens),
                    tokens), tokens)
                row["engine"]["cpu_ms_per_token"] = cpu
                row["engine"]["thread_wait_ms_per_token"] = wait

            def serve(name: str) -> Callable[[dict[str, Any]], None]:
                def serve_one(into: dict[str, Any]) -> None:
                    how = SERVER_VARIANTS[name]
                    url, pid = procs[how.env]
                    into[name] = server_closed_loop(url, clients, n_requests, max_tokens,
                                                    pid, how)
                serve_one.__name__ = name
                return serve_one

            order = [bare, engine, *(serve(name) for name in servers)]
            k = r % len(order)
            for run in order[k:] + order[:k]:  # rotated: no system always first
                run(row)
            row["order"] = [f.__name__ for f in order[k:] + order[:k]]
            if retain0:
                row["engine_retain0"] = engine_closed_loop(
                    model, replace(config, max_retained_slots=0), clients, n_requests,
                    max_tokens)
            rounds.append(row)
            print(json.dumps(row), flush=True)
        if spy_path is not None:
            spy = shutil.which("py-spy")
            if spy is None:
                raise SystemExit("py-spy is not installed")
            with subprocess.Popen([spy, "record", "-r", "50", "-f", "raw", "--threads",
                                   "-o", str(spy_path), "-p", str(server_pid)]) as recorder:
                time.sleep(1.0)  # attached
                spied = server_closed_loop(base, clients, n_requests, max_tokens)
                recorder.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
            print(f"server under py-spy: {spied['tokens_per_s']:.1f} tok/s -> {spy_path}",
                  flush=True)
    bare = max(r["bare_tokens_per_s"] for r in rounds)
    short = max(r["bare_short_tokens_per_s"] for r in rounds)
    eng = max(r["engine"]["tokens_per_s"] for r in rounds)
    srv = max(r[servers[0]]["tokens_per_s"] for r in rounds)
    per_round = {name: [round(r[name]["tokens_per_s"] / r["bare_tokens_per_s"], 3)
                        for r in rounds] for name in ("engine", *servers)}
    median_vs_bare = {name: float(np.median(v)) for name, v in per_round.items()}
    cpu = {"bare": float(np.median([r["bare_cpu_ms_per_token"] for r in rounds])),
           "engine": float(np.median([r["engine"]["cpu_ms_per_token"] for r in rounds])),
           **{f"{name}{part}": float(np.median([r[name][key] for r in rounds]))
              for name in servers
              for part, key in (("", "cpu_ms_per_token"),
                                ("_client", "client_cpu_ms_per_token"),
                                ("_event_loop", "event_loop_cpu_ms_per_token"),
                                ("_cpu_wait", "cpu_wait_ms_per_token"))}}
    print(f"clients {clients}: bare {bare:.1f} (short, old: {short:.1f}), engine {eng:.1f} "
          f"({eng / bare:.3f}x), server {srv:.1f} ({srv / bare:.3f}x; {srv / short:.3f}x the "
          f"old short loop) tok/s; per round over bare: {per_round}; medians over bare: "
          f"{ {k: round(v, 3) for k, v in median_vs_bare.items()} }; median CPU ms a token: "
          f"{ {k: round(v, 2) for k, v in cpu.items()} }", flush=True)
    result = {"benchmark": "engine_overhead_closed", "clients": clients,
              "n_requests": n_requests, "max_tokens": max_tokens, "rounds": rounds,
              "bare": "bare_closed_tokens_per_s: the engine run's prompts, prefill and refills",
              "engine_vs_bare": round(eng / bare, 3), "server_vs_bare": round(srv / bare, 3),
              "server_vs_bare_short": round(srv / short, 3),
              "per_round_vs_bare": per_round, "median_vs_bare": median_vs_bare,
              "median_cpu_ms_per_token": cpu,
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0))}
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = ("engine_overhead_closed" + ("" if clients == 8 else f"_c{clients}")
            + stem_suffix)
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    plot_closed(result, RESULTS / f"{stem}.png")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--closed", type=int, help="clients: bare vs engine vs server")
    parser.add_argument("--requests", type=int, default=16, help="--closed: requests")
    parser.add_argument("--new-tokens", type=int, default=128, help="--closed: per request")
    parser.add_argument("--rounds", type=int, default=3, help="--closed: rounds")
    parser.add_argument("--retain0", action="store_true",
                        help="--closed: also the engine with no retained prefixes")
    parser.add_argument("--spy-server", type=Path,
                        help="--closed: py-spy the server's load once more, raw stacks here")
    parser.add_argument("--servers", default="server",
                        help=f"--closed: server runs a round, of {', '.join(SERVER_VARIANTS)}")
    parser.add_argument("--suffix", default="",
                        help="--closed: added to the result files' names")
    parser.add_argument("--first-round", type=int, default=0,
                        help="--closed: number of the first round (continues a rotation)")
    parser.add_argument("--batches", default="8,32")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--py-spy", action="store_true")
    parser.add_argument("--replot-closed", action="store_true",
                        help="redraw engine_overhead_closed{--suffix}.png from its JSON")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    if args.replot_closed:
        stem = "engine_overhead_closed" + args.suffix
        closed = json.loads((RESULTS / f"{stem}.json").read_text())
        plot_closed(closed, RESULTS / f"{stem}.png")
        return 0
    if args.closed:
        return closed_main(args.closed, args.requests, args.new_tokens, args.retain0,
                           args.spy_server, args.rounds, tuple(args.servers.split(",")),
                           args.suffix, args.first_round)
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
