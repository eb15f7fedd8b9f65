"""Chaos: a bounded run at 80 % of measured capacity on the real packaged model, with a
small share of extreme-parameter requests mixed in and worker deaths injected at random
(the model's ``[models.faults]``: each forward pass kills the worker's thread, or hangs it
past the watchdog, with a small probability). Issue 11's claim, measured:

- every request gets exactly one terminal answer (no transport failure, no hang);
- the client's counts equal the server's ``sluice_requests_total`` by state, and the
  requests failed by deaths equal ``sluice_worker_failed_requests_total``;
- the server serves throughout, except the recovery windows (``/ready`` polled every
  0.25 s; every 5 s bin outside them completes requests);
- each death's recovery time (the death to the replacement having loaded the model), from
  ``/status.json``, and the not-ready windows the client saw.

To explain a bin that completed nothing, the JSON keeps every request's times (sent,
first token, end, the server's queue wait), the tokens streamed each second, and each
second's ``/status.json`` (queue, inbox, running sequences, worker status, how long it took
to answer) beside the host's load and the server's CPU; ``quiet_bins_explained`` lists
what was alive in each such bin.

Capacity is measured first on a fault-free server (closed loop, 8 clients, 20 s), then the
chaos server starts with the same model and the faults on.

    python bench/chaos.py                  # 8 minutes; alone on the machine
    python bench/chaos.py --synthetic --duration 30  # a smoke run

Writes bench/results/chaos.json and chaos.png (``--out`` renames them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.extremes import EXTREMES
from bench.lib.model_tables import GEMMA, SYNTH_CHAT, gemma_table, synthetic_chat_table
from bench.lib.outcomes import (
    Outcome,
    _kind_of,
    arrivals,
    closed,
    decision_of,
    delta,
    one_request,
    open_loop_client,
    server_counts,
    tally,
    wait_idle,
)
from bench.lib.prompts import PROMPTS, SYNTH_PROMPTS
from bench.lib.servers import free_port, process_cpu_s, process_schedstat, running, sluice_cmd

RESULTS = Path(__file__).resolve().parent / "results"
MAX_TOKENS = 32
EXTREME_MAX_TOKENS = 16
BIN_S = 5
"""Width of the bins in which "serving" is checked."""
READY_POLL_S = 0.25
SAMPLE_S = 1.0
"""How often the server's ``/status.json`` and the host are sampled."""
MARGIN_S = 2.0
"""A bin this close to a not-ready window counts as part of the recovery."""


def model_toml(synthetic: bool) -> tuple[str, str]:
    """(model id, its ``[[models]]`` table without faults). The synthetic model takes 1 s
    to load, so a replacement's load shows in the recovery times."""
    if synthetic:
        return SYNTH_CHAT, synthetic_chat_table(load_s=1.0)
    return GEMMA, gemma_table()


def server_toml(models: str, watchdog_s: float, faults: dict[str, float] | None) -> str:
    fault_table = ""
    if faults:
        fault_table = "[models.faults]\n" + "".join(f"{k} = {v}\n" for k, v in faults.items())
    return f"""
[scheduling]
queue_capacity = 64
[workers]
count = 1
inbox_capacity = 32
watchdog_s = {watchdog_s}
{models}{fault_table}"""


async def one_extreme(client: httpx.AsyncClient, base: str, model: str, fields: dict[str, Any],
                      t_base: float) -> Outcome:
    """A non-streamed chat completion with extreme sampling values."""
    body = {"model": model, "max_tokens": EXTREME_MAX_TOKENS,
            "messages": [{"role": "user", "content": "Say hello."}], **fields}
    t0 = time.perf_counter()
    try:
        r = await client.post(f"{base}/v1/chat/completions", json=body)
    except httpx.TransportError as exc:
        return Outcome("transport", 0, type(exc).__name__, t0 - t_base,
                       time.perf_counter() - t0, None)
    code, tokens = None, 0
    try:
        answer = r.json()
        if r.status_code != 200:
            code = answer["error"]["code"]
        else:
            tokens = int(answer["usage"]["completion_tokens"])
    except (ValueError, KeyError, TypeError):
        pass
    kind = "ok" if r.status_code == 200 else _kind_of(r.status_code)
    return Outcome(kind, r.status_code, code, t0 - t_base, time.perf_counter() - t0, None,
                   r.headers.get("retry-after"), tokens, None, *decision_of(r.headers))


@dataclass
class Sent:
    """What one request asked for: ``plain`` (a streamed completion of ``prompts[index]``)
    or ``extreme`` (chat with ``EXTREMES[index]``), and how it ended."""

    kind: str
    index: int
    outcome: Outcome


async def chaos_load(base: str, model: str, prompts: list[str], *, rate_per_s: float,
                     duration_s: float, extreme_share: float, seed: int, t_base: float,
                     token_log: list[float]) -> list[Sent]:
    """Poisson arrivals; each request is plain (streamed) or extreme; all awaited. Every
    streamed token's arrival goes to ``token_log``; times are s from ``t_base``."""
    rng = random.Random(seed)
    async with open_loop_client(300.0) as client:
        tasks: list[asyncio.Task[Outcome]] = []
        asked: list[tuple[str, int]] = []
        async for i in arrivals(rng, rate_per_s=rate_per_s, duration_s=duration_s,
                                t_base=t_base):
            if rng.random() < extreme_share:
                asked.append(("extreme", i % len(EXTREMES)))
                tasks.append(asyncio.create_task(one_extreme(
                    client, base, model, EXTREMES[i % len(EXTREMES)], t_base)))
            else:
                asked.append(("plain", i % len(prompts)))
                tasks.append(asyncio.create_task(one_request(
                    client, base, model, prompts[i % len(prompts)], MAX_TOKENS,
                    deadline_ms=None, t_base=t_base, token_log=token_log)))
        outcomes = await asyncio.gather(*tasks)
        return [Sent(k, j, o) for (k, j), o in zip(asked, outcomes, strict=True)]


SAMPLE_COLUMNS = ["t_s", "load_average_1m", "server_cpu_s", "server_runnable_waiting_s",
                  "status_ms", "queue_depth", "live_requests", "inbox_depth", "running",
                  "worker_status"]
"""One row a second of ``probe``: the host, the server process, and ``/status.json``
(how long it took to answer; the queue, the requests the server holds, the worker's inbox
and running sequences, and whether the worker is up)."""


def probe(base: str, pid: int, stop: threading.Event, t_base: float,
          ready: list[tuple[float, int]], samples: list[list[Any]]) -> None:
    """``/ready`` every ``READY_POLL_S``; every ``SAMPLE_S`` a ``SAMPLE_COLUMNS`` row: the
    host's 1-minute load average, the server process's CPU seconds and seconds its live
    threads spent runnable but waiting for a CPU (contention from other work shows there),
    and the server's own view from ``/status.json``."""
    next_sample = 0.0
    with httpx.Client(timeout=5) as c:
        while not stop.is_set():
            try:
                status = c.get(f"{base}/ready").status_code
            except httpx.HTTPError:
                status = 0
            now = time.perf_counter() - t_base
            ready.append((round(now, 3), status))
            if now >= next_sample:
                samples.append([round(now, 2), *host_sample(pid), *status_sample(c, base)])
                next_sample = now + SAMPLE_S
            stop.wait(READY_POLL_S)


def host_sample(pid: int) -> list[float]:
    """[load average, server CPU s, server runnable-waiting s]; NaN where /proc refused."""
    try:  # CPU from /proc/<pid>/stat counts ended threads too (dead workers)
        run_s, wait_s = process_cpu_s(pid), process_schedstat(pid)[1]
    except OSError:
        run_s = wait_s = float("nan")
    return [round(os.getloadavg()[0], 2), round(run_s, 2), round(wait_s, 2)]


def status_sample(c: httpx.Client, base: str) -> list[Any]:
    """[ms to answer, queue depth, live requests, inbox depth, running, worker status]
    from ``/status.json`` (summed over workers; Nones when it did not answer)."""
    t0 = time.perf_counter()
    try:
        st = c.get(f"{base}/status.json").json()
    except (httpx.HTTPError, ValueError):
        return [round((time.perf_counter() - t0) * 1000, 1), None, None, None, None, None]
    workers = st["workers"]
    return [round((time.perf_counter() - t0) * 1000, 1), st["queue_depth"],
            st["live_requests"], sum(w["inbox_depth"] for w in workers),
            sum(w["active"] for w in workers), ",".join(w["status"] for w in workers)]


def not_ready_windows(samples: list[tuple[float, int]]) -> list[tuple[float, float]]:
    """Runs of non-200 ``/ready`` answers: (first not-ready sample, first ready after)."""
    windows: list[tuple[float, float]] = []
    start: float | None = None
    for t, status in samples:
        if status != 200 and start is None:
            start = t
        elif status == 200 and start is not None:
            windows.append((start, t))
            start = None
    if start is not None:
        windows.append((start, samples[-1][0]))
    return windows


def outage_windows(not_ready: list[tuple[float, float]], recoveries: list[dict[str, Any]],
                   watchdog_s: float) -> list[tuple[float, float]]:
    """When the server could not serve: each not-ready window, started earlier by its
    death's detection delay (a stall is declared only after the watchdog). The windows
    and the recoveries pair in order when their counts agree; else every window is
    widened by the watchdog (a bound)."""
    if len(not_ready) == len(recoveries):
        return [(a - r["detect_s"], b) for (a, b), r in zip(not_ready, recoveries, strict=True)]
    return [(a - watchdog_s - READY_POLL_S, b) for a, b in not_ready]


def stalls_not_injected(log_path: Path) -> int:
    """Stalls the supervisor logged whose thread was not inside an injected hang (the
    stack it logs for a stall passes through ``before_call`` when the hang was ours)."""
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    entries = text.split("stopped making progress")[1:]
    return sum("in before_call" not in e.split("replaced: serving again")[0]
               for e in entries)


def supervision_metrics(base: str) -> dict[str, float]:
    text = httpx.get(f"{base}/metrics", timeout=10).text
    out: defaultdict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "sluice_worker_deaths_total":
                out[f"deaths_{s.labels['cause']}"] += s.value
            elif s.name == "sluice_worker_failed_requests_total":
                out["worker_failed_requests"] += s.value
            elif s.name == "sluice_worker_recovery_seconds_count":
                out["recoveries"] += s.value
    return dict(out)


def quiet_bins(outcomes: list[Outcome], outages: list[tuple[float, float]],
               duration_s: float) -> tuple[list[int], list[int]]:
    """(completions per ``BIN_S`` bin, the start of each bin outside the recovery windows
    (within ``MARGIN_S``) that completed nothing). The first bin warms up and the last is
    partial: neither is judged."""
    n_bins = int(duration_s // BIN_S)
    done_per_bin = [0] * (n_bins + 1)
    for o in outcomes:
        if o.kind == "ok":
            done_per_bin[min(n_bins, int((o.start_s + o.latency_s) // BIN_S))] += 1
    quiet = []
    for b in range(1, n_bins):
        lo, hi = b * BIN_S, (b + 1) * BIN_S
        in_recovery = any(a - MARGIN_S < hi and lo < e + MARGIN_S for a, e in outages)
        if not in_recovery and done_per_bin[b] == 0:
            quiet.append(lo)
    return done_per_bin, quiet


REQUEST_COLUMNS = ["kind", "index", "outcome", "status", "code", "sent_s", "first_token_s",
                   "end_s", "tokens", "queue_wait_ms", "worker"]
"""One row a request: ``plain`` (index into the prompts) or ``extreme`` (into
``EXTREMES``), its outcome, and its times in s from the start (``first_token_s`` only
for streams)."""


def request_rows(results: list[Sent]) -> list[list[Any]]:
    rows = []
    for r in results:
        o = r.outcome
        first = None if o.first_token_s is None else round(o.start_s + o.first_token_s, 3)
        rows.append([r.kind, r.index, o.kind, o.status, o.code, round(o.start_s, 3), first,
                     round(o.start_s + o.latency_s, 3), o.tokens, o.queue_wait_ms, o.worker])
    return rows


def explain_quiet(lo: float, rows: list[list[Any]], samples: list[list[Any]],
                  token_log: list[float]) -> dict[str, Any]:
    """What was alive in the bin ``[lo, lo + BIN_S)`` that completed nothing: the requests
    the client had in flight (each ``waiting``, no token yet at ``lo``, or ``streaming``),
    the tokens that arrived in it, and the server's samples around it."""
    hi = lo + BIN_S
    col = {c: i for i, c in enumerate(REQUEST_COLUMNS)}
    alive = [r for r in rows if r[col["sent_s"]] < hi and r[col["end_s"]] > lo]
    streaming = [r for r in alive
                 if r[col["first_token_s"]] is not None and r[col["first_token_s"]] <= lo]
    return {
        "bin_s": [lo, hi],
        "alive": len(alive),
        "streaming_at_start": len(streaming),
        "extremes_alive": sum(r[col["kind"]] == "extreme" for r in alive),
        "tokens_in_bin": sum(lo <= t < hi for t in token_log),
        "requests": alive,
        "samples": [s for s in samples if lo - 2 <= s[0] < hi + 2],
    }


def per_second(times_s: list[float], duration_s: float) -> list[int]:
    """How many of ``times_s`` fall in each second (the last bin takes the overrun)."""
    n = int(duration_s) + 1
    out = [0] * (n + 1)
    for t in times_s:
        out[min(n, max(0, int(t)))] += 1
    return out


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=420.0, help="seconds of chaos")
    parser.add_argument("--load", type=float, default=0.8, help="fraction of capacity")
    parser.add_argument("--capacity-s", type=float, default=20.0)
    parser.add_argument("--extreme-share", type=float, default=0.05)
    parser.add_argument("--kill-probability", type=float, default=8e-4,
                        help="per forward pass")
    parser.add_argument("--hang-probability", type=float, default=4e-4,
                        help="per forward pass")
    parser.add_argument("--hang-s", type=float, default=8.0)
    parser.add_argument("--watchdog-s", type=float, default=4.0)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--synthetic", action="store_true",
                        help="the synthetic backend instead of the packaged model (smoke)")
    parser.add_argument("--out", default="chaos")
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    model, models = model_toml(args.synthetic)
    prompts = SYNTH_PROMPTS if args.synthetic else PROMPTS

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd, _ = sluice_cmd(server_toml(models, args.watchdog_s, None), port)
    print(f"measuring capacity for {args.capacity_s:g} s (no faults)", flush=True)
    with running(cmd, f"{base}/ready", log_path=RESULTS / f"{args.out}_capacity.log"):
        cap = asyncio.run(closed(base, model, prompts, concurrency=8,
                                 duration_s=args.capacity_s, max_tokens=MAX_TOKENS))
    ok = [o for o in cap if o.kind == "ok"]
    capacity = len(ok) / max(o.start_s + o.latency_s for o in cap)
    rate = args.load * capacity

    faults = {"kill_probability": args.kill_probability,
              "hang_probability": args.hang_probability, "hang_s": args.hang_s,
              "seed": args.seed}
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd, _ = sluice_cmd(server_toml(models, args.watchdog_s, faults), port)
    probes: list[tuple[float, int]] = []
    samples: list[list[Any]] = []
    token_log: list[float] = []
    with running(cmd, f"{base}/ready", log_path=RESULTS / f"{args.out}.log") as proc:
        before = server_counts(base, model)
        print(f"capacity {capacity:.2f} req/s; chaos at {rate:.2f} req/s for "
              f"{args.duration:g} s, {args.extreme_share:.0%} extreme, faults {faults}",
              flush=True)
        stop = threading.Event()
        t0 = time.time()
        t_base = time.perf_counter()
        prober = threading.Thread(target=probe,
                                  args=(base, proc.pid, stop, t_base, probes, samples),
                                  daemon=True)
        prober.start()
        results = asyncio.run(chaos_load(base, model, prompts, rate_per_s=rate,
                                         duration_s=args.duration,
                                         extreme_share=args.extreme_share, seed=args.seed,
                                         t_base=t_base, token_log=token_log))
        wait_idle(base)
        end = time.monotonic() + 120  # a death near the end: its replacement may still load
        while httpx.get(f"{base}/ready", timeout=5).status_code != 200:
            if time.monotonic() > end:
                break
            time.sleep(READY_POLL_S)
        stop.set()
        prober.join()
        server = delta(server_counts(base, model), before)
        supervision = supervision_metrics(base)
        status = httpx.get(f"{base}/status.json", timeout=10).json()
        health = httpx.get(f"{base}/health", timeout=5).status_code
        ready = httpx.get(f"{base}/ready", timeout=5).status_code

    outcomes = [r.outcome for r in results]
    counts = tally(outcomes)
    codes = Counter(f"{o.status} {o.code}" for o in outcomes if o.kind != "ok")
    extremes = [r.outcome for r in results if r.kind == "extreme"]
    recoveries = status["recoveries"]
    recovery_s = [r["recovery_s"] for r in recoveries if r["recovery_s"] is not None]
    windows = not_ready_windows(probes)
    window_s = [b - a for a, b in windows]
    outages = outage_windows(windows, recoveries, args.watchdog_s)
    deaths = supervision.get("deaths_died", 0) + supervision.get("deaths_stalled", 0)

    done_per_bin, quiet = quiet_bins(outcomes, outages, args.duration)
    rows = request_rows(results)
    worker_failed = sum(1 for o in outcomes if o.code == "worker_failed")
    checks = {
        "zero_transport_failures": counts["transport"] == 0,
        "no_unexpected_status": counts["other"] == 0,
        "every_request_one_answer": len(outcomes) == sum(
            counts[k] for k in ("ok", "rejected", "expired", "failed", "cancelled")),
        "client_counts_equal_server_metrics": all(
            counts[c] == server[s] for c, s in (("ok", "completed"), ("failed", "failed"),
                                                ("rejected", "rejected"),
                                                ("expired", "expired"),
                                                ("cancelled", "cancelled"))),
        "failures_are_worker_deaths": counts["failed"] == worker_failed,
        "worker_failed_equal_server_metric":
            worker_failed == supervision.get("worker_failed_requests", 0),
        "extremes_served_unless_a_death_took_them": all(
            o.kind == "ok" or o.code in ("worker_failed", "queue_full") for o in extremes),
        "some_deaths_happened": deaths > 0,
        "every_death_recovered": len(recovery_s) == deaths,
        "serving_outside_recovery_windows": not quiet,
        "healthy_and_ready_after": health == 200 and ready == 200,
    }
    result = {
        "benchmark": "chaos",
        "command": "python bench/chaos.py" + (" --synthetic" if args.synthetic else "")
                   + f" --duration {args.duration:g}",
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)),
        "machine": {"platform": platform.platform()},
        "model": model,
        "duration_s": args.duration,
        "capacity_requests_per_s": round(capacity, 3),
        "offered_requests_per_s": round(rate, 3),
        "load_fraction": args.load,
        "max_tokens": MAX_TOKENS,
        "extreme_share": args.extreme_share,
        "faults": faults,
        "watchdog_s": args.watchdog_s,
        "sent": len(outcomes),
        "extreme_sent": len(extremes),
        "extreme_ok": sum(o.kind == "ok" for o in extremes),
        "client": counts,
        "client_error_codes": dict(codes),
        "server": server,
        "supervision": supervision,
        "deaths": deaths,
        "stalls_not_injected": stalls_not_injected(RESULTS / f"{args.out}.log"),
        "recoveries": recoveries,
        "recovery_s": {"p50": percentile(recovery_s, 0.5), "max": max(recovery_s, default=None),
                       "mean": statistics.fmean(recovery_s) if recovery_s else None},
        "detect_s": {"max": max((r["detect_s"] for r in recoveries), default=None)},
        "not_ready_windows_s": [[round(a, 2), round(b, 2)] for a, b in windows],
        "outage_windows_s": [[round(a, 2), round(b, 2)] for a, b in outages],
        "outage_s_total": round(sum(b - a for a, b in outages), 2),
        "samples": {"columns": SAMPLE_COLUMNS, "rows": samples},
        "not_ready_s": {"p50": percentile(window_s, 0.5), "max": max(window_s, default=None),
                        "total": round(sum(window_s), 2)},
        "ok_latency_p50_s": percentile([o.latency_s for o in outcomes if o.kind == "ok"], 0.5),
        "quiet_bins_outside_recovery": quiet,
        "quiet_bins_explained": [explain_quiet(lo, rows, samples, token_log) for lo in quiet],
        "ok_per_bin": done_per_bin,
        "tokens_per_s": per_second(token_log, args.duration),
        "bin_s": BIN_S,
        "health_after": health,
        "ready_after": ready,
        "checks": checks,
        "passed": all(checks.values()),
        "requests": {"columns": REQUEST_COLUMNS, "rows": rows},
    }
    (RESULTS / f"{args.out}.json").write_text(json.dumps(result, indent=1))
    plot(result, outcomes, RESULTS / f"{args.out}.png")
    print(json.dumps({k: v for k, v in result.items()
                      if k not in ("ok_per_bin", "recoveries", "not_ready_windows_s",
                                   "requests", "samples", "outage_windows_s",
                                   "tokens_per_s")},
                     indent=1))
    return 0 if result["passed"] else 1


def plot(result: dict[str, Any], outcomes: list[Outcome], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, m, b) = plt.subplots(3, 1, figsize=(11, 10),
                                  gridspec_kw={"height_ratios": [3, 2, 2]})
    bins = int(result["duration_s"]) + 1
    colors = {"ok": "#16a34a", "failed": "#7c3aed", "rejected": "#f59e0b",
              "expired": "#dc2626"}
    for kind, color in colors.items():
        per_s = [0] * bins
        for o in outcomes:
            if o.kind == kind:
                per_s[min(bins - 1, int(o.start_s + o.latency_s))] += 1
        window = 5
        series = [sum(per_s[i:i + window]) / window for i in range(0, bins, window)]
        if any(series):
            a.plot([i * window for i in range(len(series))], series, color=color, label=kind)
    for lo, hi in result["outage_windows_s"]:
        a.axvspan(lo, hi, color="#ef4444", alpha=0.2)
    a.set(title=f"chaos on {result['model']}: {result['sent']} requests at "
                f"{result['load_fraction']:.0%} load, {int(result['deaths'])} worker "
                "deaths (red: death to replacement serving)",
          xlabel="s (by answer time, 5 s means)", ylabel="answers/s")
    a.legend(fontsize=8)
    a.grid(alpha=0.3)
    cols = {c: i for i, c in enumerate(result["samples"]["columns"])}
    rows = [r for r in result["samples"]["rows"] if r[cols["queue_depth"]] is not None]
    t = [r[cols["t_s"]] for r in rows]
    for name, color in (("queue_depth", "#f59e0b"), ("inbox_depth", "#0ea5e9"),
                        ("running", "#16a34a")):
        m.plot(t, [r[cols[name]] for r in rows], color=color, label=f"server {name}", lw=0.8)
    for lo, hi in result["outage_windows_s"]:
        m.axvspan(lo, hi, color="#ef4444", alpha=0.2)
    for lo in result["quiet_bins_outside_recovery"]:
        m.axvspan(lo, lo + result["bin_s"], color="#737373", alpha=0.3)
    tokens = m.twinx()
    tokens.plot(range(len(result["tokens_per_s"])), result["tokens_per_s"], color="#7c3aed",
                lw=0.6, alpha=0.6, label="tokens/s streamed (client)")
    tokens.set_ylabel("tokens/s")
    m.set(title="server /status.json each second (grey: bins outside recovery that completed "
                "nothing)", xlabel="s", ylabel="requests")
    m.legend(fontsize=8, loc="upper left")
    tokens.legend(fontsize=8, loc="upper right")
    m.grid(alpha=0.3)
    recs = result["recoveries"]
    b.bar(range(len(recs)), [r["recovery_s"] or 0 for r in recs],
          color=["#7c3aed" if r["cause"].startswith("died") else "#0ea5e9" for r in recs])
    b.set(title="recovery time per death (death -> replacement loaded; purple: thread died, "
                "blue: stalled past the watchdog)", xlabel="death #", ylabel="s")
    b.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    raise SystemExit(main())
