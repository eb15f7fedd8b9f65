"""Goodput sweep of the variant planner: open-loop arrivals of real labelled text against
the ``sentiment`` group, at a mean of ρ × the measured capacity of the accurate-only pool,
with a stated deadline, for four policies in one run. Two arrival processes
(``--processes``): ``poisson``, and ``onoff`` — bursts: a two-state MMPP that sends at
``(on + off) / on`` × the mean rate while on and nothing while off, with exponential
state durations (means ``--burst-on-s`` / ``--burst-off-s``), so the mean is the same ρ.
The policies:

* ``accurate``: always the most accurate variant, on a server that is not told the
  deadline: it serves every request, late or not, first come first served (what a server
  without deadlines does, and the baseline of the seed's result);
* ``accurate_expiry``: always the most accurate variant, the deadline sent: sluice drops
  a request still queued at its deadline (504) instead of serving it late;
* ``fastest``: always the fastest variant (deadline sent);
* ``adaptive``: the planner (deadline sent).

Per point it reports goodput (requests answered 200 within the deadline, per second of
offered load), the accuracy of the traffic actually served (answers checked against the
human labels), p95 latency, the variant mix, rejections/expiries, and compute cost (CPU
seconds the server process used per request answered in time). Each (policy, ρ) runs in
a fresh server; ``--repeats`` runs the whole grid again to show the run-to-run spread.

    .venv/bin/python bench/goodput_sweep.py

Needs ``sluice prepare`` (and ideally ``sluice profile``) first. Writes
``bench/results/goodput_sweep.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.lib.servers import free_port, running  # noqa: E402
from sluice import prep  # noqa: E402
from sluice.sim.workload import WorkloadSpec, arrival_times  # noqa: E402

PROCESSES = ("poisson", "onoff")

POLICIES = ("accurate", "accurate_expiry", "fastest", "adaptive")
SERVER_POLICY = {"accurate": "accurate", "accurate_expiry": "accurate", "fastest": "fastest",
                 "adaptive": "adaptive"}
"""The planner policy each sweep policy runs the server with."""
SENDS_DEADLINE = {"accurate": False, "accurate_expiry": True, "fastest": True,
                  "adaptive": True}
"""Whether the server is told the request's deadline (goodput always counts it)."""
RESULTS = ROOT / "bench" / "results"


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load_texts(manifest: dict[str, Any], seed: int) -> list[tuple[str, str]]:
    rows = [json.loads(line) for line in Path(manifest["test_file"]).read_text().splitlines()]
    pairs = [(r["text"], r["label"]) for r in rows]
    random.Random(seed).shuffle(pairs)
    return pairs


async def one(client: httpx.AsyncClient, model: str, text: str, label: str,
              deadline_ms: float | None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "input": text}
    if deadline_ms is not None:
        body["deadline_ms"] = deadline_ms
    t0 = time.perf_counter()
    try:
        r = await client.post("/v1/infer", json=body, timeout=60.0)
    except httpx.HTTPError as exc:
        return {"status": 0, "latency_s": time.perf_counter() - t0, "error": type(exc).__name__}
    out: dict[str, Any] = {"status": r.status_code, "latency_s": time.perf_counter() - t0,
                           "variant": r.headers.get("x-sluice-variant")}
    out |= decision(r.headers)
    if r.status_code == 200:
        probs = r.json()["output"]
        out["correct"] = max(probs, key=probs.get) == label
    else:
        try:
            out["code"] = r.json()["error"]["code"]
        except (ValueError, KeyError, TypeError):
            out["code"] = None
    return out


DECISION_HEADERS = {
    "predicted_wait_ms": "x-sluice-predicted-wait-ms", "queue_wait_ms": "x-sluice-queue-wait-ms",
    "predicted_sojourn_ms": "x-sluice-predicted-sojourn-ms", "sojourn_ms": "x-sluice-sojourn-ms",
    "batch_size": "x-sluice-batch-size", "run_ms": "x-sluice-run-ms",
    "predicted_run_ms": "x-sluice-predicted-run-ms",
}
"""Numbers the server reports per request (``plan_headers``): the planner's prediction
and what happened, in the server's own time."""


def decision(headers: httpx.Headers) -> dict[str, Any]:
    """A response's decision record: ``DECISION_HEADERS`` present as numbers, the plan's
    reason, and whether the pool was idle / the accurate variant fitted alone (bools)."""
    out: dict[str, Any] = {k: float(headers[h]) for k, h in DECISION_HEADERS.items()
                           if h in headers}
    if "x-sluice-plan-reason" in headers:
        out["plan_reason"] = headers["x-sluice-plan-reason"]
    for key, h in (("pool_idle", "x-sluice-pool-idle"),
                   ("accurate_fits_alone", "x-sluice-accurate-fits-alone")):
        if h in headers:
            out[key] = headers[h] == "1"
    return out


def arrival_offsets(process: str, mean_per_s: float, duration_s: float, seed: int,
                    on_s: float = 1.0, off_s: float = 1.0) -> list[float]:
    """Arrival instants (seconds from the start) of ``process`` at a mean of
    ``mean_per_s``, seeded (the policies of one repeat see the same arrivals)."""
    if process == "poisson":
        spec = WorkloadSpec("poisson", mean_per_s, duration_s)
    elif process == "onoff":
        spec = WorkloadSpec("onoff", mean_per_s * (on_s + off_s) / on_s, duration_s,
                            on_s=on_s, off_s=off_s)
    else:
        raise ValueError(f"process must be one of {PROCESSES}, got {process!r}")
    out = []
    for at in arrival_times(spec, random.Random(seed)):
        if at > duration_s:
            return out
        out.append(at)
    return out


async def open_loop(url: str, model: str, texts: list[tuple[str, str]],
                    offsets: list[float], deadline_ms: float | None
                    ) -> list[dict[str, Any]]:
    """Send one request at each offset, at absolute times (no drift from late wake-ups);
    each sample records its offset as ``at_s``."""
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=200)

    async def timed(at: float, text: str, label: str) -> dict[str, Any]:
        return {"at_s": at, "chars": len(text),
                **(await one(client, model, text, label, deadline_ms))}

    async with httpx.AsyncClient(base_url=url, limits=limits) as client:
        tasks = []
        t0 = time.perf_counter()
        for i, at in enumerate(offsets):
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            text, label = texts[i % len(texts)]
            tasks.append(asyncio.create_task(timed(at, text, label)))
        return list(await asyncio.gather(*tasks))


async def closed_loop(url: str, model: str, texts: list[tuple[str, str]], concurrency: int,
                      duration_s: float) -> float:
    """Completions per second with ``concurrency`` requests always outstanding."""
    done = 0
    end = time.perf_counter() + duration_s
    async with httpx.AsyncClient(base_url=url) as client:
        async def user(k: int) -> None:
            nonlocal done
            i = k
            while time.perf_counter() < end:
                text, label = texts[i % len(texts)]
                i += concurrency
                if (await one(client, model, text, label, None))["status"] == 200:
                    done += 1
        t0 = time.perf_counter()
        await asyncio.gather(*(user(k) for k in range(concurrency)))
        return done / (time.perf_counter() - t0)


MISS_FIELDS = ("at_s", "chars", "status", "code", "error", "variant", "plan_reason",
               "pool_idle", "batch_size", "predicted_wait_ms", "queue_wait_ms",
               "predicted_sojourn_ms", "sojourn_ms", "predicted_run_ms", "run_ms")
"""What a miss's record keeps (``latency_ms`` and ``arrivals_before`` are added)."""
ONSET_WINDOW_S = 0.5
"""``arrivals_before``: arrivals in this many seconds up to a miss (itself included)."""


def misses(samples: list[dict[str, Any]], deadline_ms: float) -> list[dict[str, Any]]:
    """Every request not answered 200 within the deadline, in arrival order: when it
    arrived (seconds from the run's start), its text's length, where it ran and in what
    batch, the planner's predicted wait and sojourn against the server's own, the client's
    latency, and how many requests arrived in the ``ONSET_WINDOW_S`` before it (a burst's
    onset shows as a count well above the mean rate's)."""
    ats = sorted(s["at_s"] for s in samples)
    out = []
    for s in sorted(samples, key=lambda x: x["at_s"]):
        if s["status"] == 200 and s["latency_s"] * 1000 <= deadline_ms:
            continue
        rec = {k: s[k] for k in MISS_FIELDS if s.get(k) is not None}
        rec["latency_ms"] = round(s["latency_s"] * 1000, 1)
        rec["arrivals_before"] = sum(1 for a in ats if s["at_s"] - ONSET_WINDOW_S < a <= s["at_s"])
        out.append(rec)
    return out


def plan_shares(samples: list[dict[str, Any]], best: str) -> dict[str, Any]:
    """How the planner's requests found the pool and where they went: ``idle_fits``
    (idle pool, the accurate variant meets the deadline alone: the requests that
    accurate-only would serve in time; ``on_best`` of them went to it), ``idle_too_long``
    (idle pool, it would not), ``busy`` (something queued or running); and the plan
    reasons. Answered and refused requests alike (a refusal has no variant)."""
    groups: dict[str, dict[str, int]] = {
        k: {"n": 0, "on_best": 0} for k in ("idle_fits", "idle_too_long", "busy")}
    reasons: dict[str, int] = {}
    for s in samples:
        if "plan_reason" in s:
            reasons[s["plan_reason"]] = reasons.get(s["plan_reason"], 0) + 1
        if s.get("pool_idle") is None or s.get("accurate_fits_alone") is None:
            continue
        key = ("busy" if not s["pool_idle"] else
               "idle_fits" if s["accurate_fits_alone"] else "idle_too_long")
        groups[key]["n"] += 1
        groups[key]["on_best"] += s.get("variant") == best
    return {**groups, "reasons": reasons}


def summarize(samples: list[dict[str, Any]], duration_s: float, deadline_ms: float,
              cpu_s: float, best: str | None = None) -> dict[str, Any]:
    ok = [s for s in samples if s["status"] == 200]
    good = [s for s in ok if s["latency_s"] * 1000 <= deadline_ms]
    lat = sorted(s["latency_s"] for s in ok)
    mix: dict[str, int] = {}
    for s in ok:
        mix[s["variant"]] = mix.get(s["variant"], 0) + 1
    codes: dict[str, int] = {}
    for s in samples:
        if s["status"] != 200:
            key = f"{s['status']}:{s.get('code') or s.get('error')}"
            codes[key] = codes.get(key, 0) + 1
    p95 = lat[min(len(lat) - 1, int(0.95 * len(lat)))] * 1000 if lat else None
    return {
        "sent": len(samples), "ok": len(ok), "good": len(good),
        "goodput_per_s": len(good) / duration_s,
        "served_accuracy": (sum(1 for s in ok if s["correct"]) / len(ok)) if ok else None,
        "good_accuracy": (sum(1 for s in good if s["correct"]) / len(good)) if good else None,
        "p50_ms": lat[len(lat) // 2] * 1000 if lat else None, "p95_ms": p95,
        "variant_mix": mix, "failures": codes,
        "cpu_s_per_good": cpu_s / len(good) if good else None, "cpu_s": cpu_s,
        "misses": misses(samples, deadline_ms),
        **({"plan": plan_shares(samples, best)} if best else {}),
    }


def add_server_args(p: argparse.ArgumentParser) -> None:
    """The flags ``setup`` and ``serve`` read: the prepared cache and its variants, and the
    server's shape (the sweep and the step bench serve the same system)."""
    p.add_argument("--cache", help="the cache folder `sluice prepare` wrote")
    p.add_argument("--variants", nargs="*", help="variants (default: all, by accuracy)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--max-wait-ms", type=float, default=2.0)
    p.add_argument("--queue-capacity", type=int, default=256)
    p.add_argument("--pessimism", type=float, default=1.0)


def setup(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(the prepared cache's manifest, its profile if profiled); ``args.variants``
    defaults to all of them, most accurate first."""
    manifest = prep.load_manifest(Path(args.cache) if args.cache else None)
    args.variants = args.variants or prep.by_accuracy(manifest)
    prof_path = Path(manifest["cache_dir"]) / "profile.json"
    profile = json.loads(prof_path.read_text()) if prof_path.is_file() else None
    return manifest, profile


def serve(manifest: dict[str, Any], policy: str, args: argparse.Namespace,
          profile: dict[str, Any] | None, tag: str) -> tuple[Any, str, Path]:
    scratch = Path(tempfile.gettempdir()) / "sluice-goodput"
    scratch.mkdir(exist_ok=True)
    cfg = scratch / f"{tag}.toml"
    prep.write_config(manifest, cfg, variants=args.variants, threads=args.threads,
                      workers=args.workers, policy=SERVER_POLICY[policy], profile=profile,
                      max_batch_size=args.max_batch, max_wait_ms=args.max_wait_ms,
                      queue_capacity=args.queue_capacity, pessimism=args.pessimism)
    port = free_port()
    cmd = [sys.executable, "-m", "sluice.cli", "serve", "-c", str(cfg), "--port", str(port),
           "--log-level", "warning", "--open-admin"]
    url = f"http://127.0.0.1:{port}"
    return running(cmd, f"{url}/ready", scratch / f"{tag}.log"), url, cfg


def warm(url: str, variants: list[str]) -> None:
    """Load every variant before measuring, through the admin API: warm-up requests would
    count as arrivals and skew the planner's measured rate at the start of the run."""
    with httpx.Client(base_url=url, timeout=120.0) as client:
        for v in variants:
            client.post(f"/admin/models/sentiment-{v}/load").raise_for_status()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_server_args(p)
    p.add_argument("--rhos", default="0.4,0.8,0.95,1.3")
    p.add_argument("--processes", default=",".join(PROCESSES),
                   help="arrival processes, each at the same mean per ρ")
    p.add_argument("--burst-on-s", type=float, default=1.0,
                   help="onoff: mean seconds of a burst (sending at (on+off)/on × the mean)")
    p.add_argument("--burst-off-s", type=float, default=1.0,
                   help="onoff: mean seconds of silence between bursts")
    p.add_argument("--capacity-per-s", type=float,
                   help="the accurate-only capacity measured by an earlier run (skips "
                        "measuring it, so a sweep split into parts shares one ρ scale)")
    p.add_argument("--policies", default=",".join(POLICIES),
                   help="a subset of the policies to run (adaptive and both accurate-only "
                        "baselines are needed for the ratios)")
    p.add_argument("--deadline-ms", type=float,
                   help="default: 1.5 × the accurate variant's profiled full-batch time")
    p.add_argument("--duration-s", type=float, default=15.0)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--capacity-s", type=float, default=8.0,
                   help="seconds of closed loop per concurrency when measuring capacity")
    p.add_argument("--out", default=str(RESULTS / "goodput_sweep.json"))
    p.add_argument("--samples-dir", metavar="DIR",
                   help="also write every request's record, one JSONL file per run")
    p.add_argument("--render", metavar="JSON",
                   help="recompute an earlier result's tables from its points, rewrite its "
                        "JSON and PNG, print the tables and exit")
    p.add_argument("--merge", nargs="+", metavar="JSON",
                   help="join the points of results measured in parts (same deadline and "
                        "capacity) into --out, and exit")
    args = p.parse_args()
    if args.render:
        write(report(json.loads(Path(args.render).read_text())), Path(args.render))
        return 0
    if args.merge:
        write(report(merge([json.loads(Path(m).read_text()) for m in args.merge])),
              Path(args.out))
        return 0
    manifest, profile = setup(args)
    if args.deadline_ms is None:
        full = (profile or {}).get("variants", {}).get(args.variants[0], {}).get("batch_ms", {})
        top = full.get(str(args.max_batch))
        args.deadline_ms = round(1.5 * float(top) / 10) * 10 if top else 100.0
    print(f"deadline {args.deadline_ms:.0f} ms", flush=True)
    texts = load_texts(manifest, seed=7)
    rhos = [float(x) for x in args.rhos.split(",")]
    processes = [x for x in args.processes.split(",") if x]
    if set(processes) - set(PROCESSES):
        p.error(f"unknown processes {processes}; choose from {PROCESSES}")
    policies = [x for x in args.policies.split(",") if x]
    unknown = set(policies) - set(POLICIES)
    if unknown:
        p.error(f"unknown policies {sorted(unknown)}; choose from {POLICIES}")
    RESULTS.mkdir(parents=True, exist_ok=True)

    # 1. Capacity of the accurate-only pool: the most it completes per second, in closed
    # loop at several concurrencies. A full queue makes batches of max_batch, which need
    # not be the most efficient size (on one CPU thread batch 2 can beat batch 8), so one
    # concurrency alone could understate it, and "ρ = 0.95" would really be lighter.
    if args.capacity_per_s:
        capacity, by_level = args.capacity_per_s, {}
        print(f"accurate-only capacity: {capacity:.1f} req/s (given)", flush=True)
    else:
        ctx, url, _ = serve(manifest, "accurate", args, profile, "capacity")
        levels = sorted({2, max(2, args.max_batch // 2), args.max_batch, 4 * args.max_batch})
        with ctx:
            warm(url, args.variants[:1])
            by_level = {c: asyncio.run(closed_loop(url, "sentiment", texts, c,
                                                   args.capacity_s)) for c in levels}
        capacity = max(by_level.values())
        print(f"accurate-only capacity: {capacity:.1f} req/s ({args.variants[0]}); by "
              f"concurrency: {', '.join(f'{c}: {r:.1f}' for c, r in by_level.items())}",
              flush=True)

    points = []
    for rep in range(args.repeats):
        for process in processes:
            for rho in rhos:
                offsets = arrival_offsets(process, rho * capacity, args.duration_s,
                                          seed=1000 * rep + int(rho * 100),
                                          on_s=args.burst_on_s, off_s=args.burst_off_s)
                for policy in policies:
                    point = run_point(manifest, policy, args, profile, texts, offsets,
                                      tag=f"{policy}_{process}_{rho}_{rep}")
                    point = {"repeat": rep, "process": process, "rho": rho,
                             "policy": policy, "offered_per_s": rho * capacity, **point}
                    points.append(point)
                    print(f"rep {rep} {process:<7} ρ={rho:<4} {policy:<8} goodput "
                          f"{point['goodput_per_s']:7.1f}/s  in deadline "
                          f"{point['good'] / max(1, point['sent']):.1%}  acc "
                          f"{point['served_accuracy'] or 0:.3f}  p95 "
                          f"{point['p95_ms'] or 0:7.1f} ms  mix {point['variant_mix']}  "
                          f"fail {point['failures']}", flush=True)
                    for m in point["misses"]:
                        print(f"    miss {miss_line(m)}", flush=True)

    result = report({
        "variants": {v: manifest["variants"][v]["accuracy"] for v in args.variants},
        "capacity_per_s": capacity,
        "capacity_by_concurrency": {str(c): r for c, r in by_level.items()},
        "deadline_ms": args.deadline_ms,
        "duration_s": args.duration_s, "repeats": args.repeats, "threads": args.threads,
        "workers": args.workers, "max_batch": args.max_batch, "max_wait_ms": args.max_wait_ms,
        "pessimism": args.pessimism, "cores": len(os.sched_getaffinity(0)),
        "burst_on_s": args.burst_on_s, "burst_off_s": args.burst_off_s,
        "points": points,
    })
    write(result, Path(args.out))
    return 0


def run_point(manifest: dict[str, Any], policy: str, args: argparse.Namespace,
              profile: dict[str, Any] | None, texts: list[tuple[str, str]],
              offsets: list[float], tag: str = "run") -> dict[str, Any]:
    """One policy against one arrival sequence, in a fresh server (``tag`` names its
    samples file under ``--samples-dir``)."""
    ctx, url, _ = serve(manifest, policy, args, profile, f"{policy}")
    with ctx as proc:
        warm(url, args.variants)
        cpu0 = cpu_seconds(proc.pid)
        samples = asyncio.run(open_loop(
            url, "sentiment", texts, offsets,
            args.deadline_ms if SENDS_DEADLINE[policy] else None))
        cpu = cpu_seconds(proc.pid) - cpu0
    if args.samples_dir:
        folder = Path(args.samples_dir)
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / f"{tag}.jsonl").open("w") as f:
            f.writelines(json.dumps(x) + "\n" for x in samples)
    return summarize(samples, args.duration_s, args.deadline_ms, cpu,
                     best=f"sentiment-{args.variants[0]}")


def miss_line(m: dict[str, Any]) -> str:
    """One miss on one line (a field the server did not report prints as ``-``)."""
    def g(key: str, fmt: str = ".0f") -> str:
        x = m.get(key)
        return "-" if x is None else format(x, fmt) if isinstance(x, float) else str(x)
    return (f"at {m['at_s']:6.2f}s {g('status')}:{g('code')} {g('variant')} "
            f"({g('plan_reason')}, idle {g('pool_idle')}) {g('chars')} chars, batch "
            f"{g('batch_size')}; wait {g('predicted_wait_ms')} predicted / "
            f"{g('queue_wait_ms')} ms; sojourn {g('predicted_sojourn_ms')} predicted / "
            f"{g('sojourn_ms')} server / {g('latency_ms')} client ms; run "
            f"{g('predicted_run_ms')} predicted / {g('run_ms')} ms; "
            f"{g('arrivals_before')} arrivals in the {ONSET_WINDOW_S} s before")


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One result from parts measured separately: the first part's settings, every
    part's points. The parts must share the deadline and the capacity (the ρ scale)."""
    first = parts[0]
    for other in parts[1:]:
        for key in ("deadline_ms", "capacity_per_s", "duration_s", "variants"):
            if other[key] != first[key]:
                raise SystemExit(f"cannot merge: {key} differs ({first[key]} vs {other[key]})")
    return {**first, "repeats": max(p["repeats"] for p in parts),
            "points": [q for p in parts for q in p["points"]]}


def write(result: dict[str, Any], out: Path) -> None:
    """The JSON and PNG of a result, and its tables on stdout."""
    out.write_text(json.dumps(result, indent=2) + "\n")
    plot(result, out.with_suffix(".png"))
    print(markdown(result))
    print(ratio_lines(result))
    print(plan_lines(result))
    print(f"wrote {out} and {out.with_suffix('.png')}")


def fmt_num(x: float | None, fmt: str) -> str:
    """``x`` formatted (a trailing ``×`` in ``fmt`` is kept as a suffix), or a dash for a
    missing number."""
    if x is None:
        return "–"
    return format(x, fmt.removesuffix("×")) + ("×" if fmt.endswith("×") else "")


def process_of(point: dict[str, Any]) -> str:
    """A point's (or table row's) arrival process (results from before bursts were
    swept are Poisson)."""
    return str(point.get("process", "poisson"))


def report(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` with its ``table`` and ``ratios`` (re)computed from its ``points``."""
    accuracy: dict[str, float] = result["variants"]
    best = next(iter(accuracy))
    rhos = sorted({q["rho"] for q in result["points"]})
    processes = [p for p in PROCESSES if any(process_of(q) == p for q in result["points"])]
    table = []
    for process in processes:
        for rho in rhos:
            for policy in POLICIES:
                mine = [q for q in result["points"] if q["rho"] == rho
                        and q["policy"] == policy and process_of(q) == process]
                if mine:
                    table.append(table_row(mine, accuracy, best)
                                 | {"process": process, "rho": rho, "policy": policy})
    return {**result, "table": table, "ratios": ratios(table, result["points"])}


def table_row(mine: list[dict[str, Any]], accuracy: dict[str, float], best: str
              ) -> dict[str, Any]:
    """One (process, ρ, policy) over its repeats."""
    gp = [q["goodput_per_s"] for q in mine]
    # Good answers over requests sent: the repeats draw different arrivals (and so
    # different counts), so the run-to-run spread is measured on this fraction.
    frac = [q["good"] / q["sent"] for q in mine if q["sent"]]
    frac_mean = statistics.fmean(frac) if frac else None
    acc = [q["served_accuracy"] for q in mine if q["served_accuracy"] is not None]
    p95 = [q["p95_ms"] for q in mine if q["p95_ms"] is not None]
    good = sum(q["good"] for q in mine)
    mix: dict[str, int] = {}
    for q in mine:
        for model, n in q["variant_mix"].items():
            v = model.removeprefix("sentiment-")
            mix[v] = mix.get(v, 0) + n
    served = sum(mix.values())
    return {
        "goodput_mean": statistics.fmean(gp), "goodput_min": min(gp), "goodput_max": max(gp),
        "good_fraction": frac_mean,
        "good_fraction_min": min(frac) if frac else None,
        "good_fraction_spread": ratio(max(frac) - min(frac), frac_mean) if frac else None,
        "served_accuracy": statistics.fmean(acc) if acc else None,
        "mix_accuracy": ratio(sum(accuracy[v] * n for v, n in mix.items()), served),
        "p95_ms": statistics.fmean(p95) if p95 else None,
        # Pooled over the repeats: one starved repeat does not dominate a mean.
        "cpu_ms_per_good": ratio(1000 * sum(q["cpu_s"] for q in mine), good),
        "share_on_best": ratio(mix.get(best, 0), served),
        "mix": mix,
        "plan": pooled_plan([q["plan"] for q in mine if "plan" in q]),
        "misses": sum(q["sent"] - q["good"] for q in mine),
    }


def pooled_plan(plans: list[dict[str, Any]]) -> dict[str, Any] | None:
    """``plan_shares`` summed over repeats (``None`` for runs from before it existed)."""
    if not plans:
        return None
    out: dict[str, Any] = {k: {"n": 0, "on_best": 0}
                           for k in ("idle_fits", "idle_too_long", "busy")}
    reasons: dict[str, int] = {}
    for plan in plans:
        for k in out:
            out[k]["n"] += plan[k]["n"]
            out[k]["on_best"] += plan[k]["on_best"]
        for reason, n in plan["reasons"].items():
            reasons[reason] = reasons.get(reason, 0) + n
    return {**out, "reasons": reasons}


def ratio(num: float | None, den: float | None) -> float | None:
    """``num / den``, or ``None`` when either is missing or the denominator is 0."""
    return None if num is None or not den else num / den


def points_lost(ref: float | None, new: float | None) -> float | None:
    """Accuracy points from ``ref`` down to ``new`` (both 0..1), or ``None``."""
    return None if ref is None or new is None else 100 * (ref - new)


def span(pair: list[float] | None) -> str:
    """``[lo–hi]`` of a per-repeat range, or nothing."""
    return "" if not pair else f"[{pair[0]:.2f}–{pair[1]:.2f}]"


def ratios(table: list[dict[str, Any]], points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per process and ρ: adaptive's goodput and CPU per good answer over each baseline's
    (all repeats pooled; the policies of one repeat saw the same arrivals, so the
    per-repeat ratios are paired and their range is given too), and the accuracy it gave
    up against the accurate-only baselines or gained over ``fastest`` (measured on what
    was served, and expected from the variant mix and the frontier: the latter without
    sampling noise)."""
    good = {(process_of(q), q["rho"], q["policy"], q["repeat"]): q["good"] for q in points}
    out = []
    for process in [p for p in PROCESSES if any(process_of(r) == p for r in table)]:
        for rho in sorted({r["rho"] for r in table if process_of(r) == process}):
            row = {r["policy"]: r for r in table if r["rho"] == rho and process_of(r) == process}
            if "adaptive" not in row:
                continue
            ada = row["adaptive"]
            entry: dict[str, Any] = {"process": process, "rho": rho}
            for base in ("accurate", "accurate_expiry", "fastest"):
                if base not in row:
                    continue
                ref = row[base]
                entry[f"goodput_vs_{base}"] = ratio(ada["goodput_mean"], ref["goodput_mean"])
                paired = [good[k] / good[(process, rho, base, k[3])] for k in good
                          if k[:3] == (process, rho, "adaptive")
                          and good.get((process, rho, base, k[3]))]
                entry[f"goodput_vs_{base}_range"] = [min(paired), max(paired)] if paired \
                    else None
                entry[f"cost_vs_{base}"] = ratio(ada["cpu_ms_per_good"] or None,
                                                 ref["cpu_ms_per_good"])
                entry[f"accuracy_points_vs_{base}"] = points_lost(ref["served_accuracy"],
                                                                  ada["served_accuracy"])
                entry[f"mix_accuracy_points_vs_{base}"] = points_lost(ref["mix_accuracy"],
                                                                      ada["mix_accuracy"])
            entry["adaptive_share_on_best"] = ada.get("share_on_best")
            entry["adaptive_good_fraction"] = ada.get("good_fraction")
            entry["adaptive_good_fraction_min"] = ada.get("good_fraction_min")
            out.append(entry)
    return out


def markdown(result: dict[str, Any]) -> str:
    """The summary table (mean over repeats; goodput as mean [min-max])."""
    lines = ["| process | ρ | policy | goodput /s [min–max] | in deadline: mean (worst "
             "repeat) | served accuracy | p95 ms | CPU ms per good answer | "
             "variant mix (all repeats) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in result["table"]:
        mix = row["mix"]
        total = sum(mix.values()) or 1
        mix_s = ", ".join(f"{k} {100 * n / total:.0f}%" for k, n in
                          sorted(mix.items(), key=lambda kv: -kv[1]))
        lines.append(
            f"| {row.get('process', 'poisson')} | {row['rho']} | {row['policy']} | "
            f"{row['goodput_mean']:.1f} [{row['goodput_min']:.1f}–{row['goodput_max']:.1f}] | "
            f"{fmt_num(row.get('good_fraction'), '.1%')} "
            f"({fmt_num(row.get('good_fraction_min'), '.1%')}) | "
            f"{fmt_num(row['served_accuracy'], '.3f')} | {fmt_num(row['p95_ms'], '.0f')} | "
            f"{fmt_num(row['cpu_ms_per_good'], '.1f')} | {mix_s} |")
    return "\n".join(lines)


def ratio_lines(result: dict[str, Any]) -> str:
    """The headline ratios as a markdown table."""
    lines = ["| process | ρ | adaptive in deadline (worst repeat) | goodput ÷ fastest | "
             "accuracy points above fastest: measured / from the mix | goodput ÷ accurate | "
             "÷ accurate_expiry | accuracy points given up vs accurate | on the best variant |",
             "|---|---|---|---|---|---|---|---|---|"]
    for e in result["ratios"]:
        g = e.get  # a run without one of the baselines has no ratios against it
        share = g("adaptive_share_on_best")
        above = [None if x is None else -x for x in
                 (g("accuracy_points_vs_fastest"), g("mix_accuracy_points_vs_fastest"))]
        lines.append(
            f"| {e.get('process', 'poisson')} | {e['rho']} | "
            f"{fmt_num(g('adaptive_good_fraction'), '.1%')} "
            f"({fmt_num(g('adaptive_good_fraction_min'), '.1%')}) | "
            f"{fmt_num(g('goodput_vs_fastest'), '.3f×')} {span(g('goodput_vs_fastest_range'))} | "
            f"{fmt_num(above[0], '.1f')} / {fmt_num(above[1], '.1f')} | "
            f"{fmt_num(g('goodput_vs_accurate'), '.2f×')} "
            f"{span(g('goodput_vs_accurate_range'))} | "
            f"{fmt_num(g('goodput_vs_accurate_expiry'), '.2f×')} "
            f"{span(g('goodput_vs_accurate_expiry_range'))} | "
            f"{fmt_num(g('accuracy_points_vs_accurate'), '.2f')} | "
            f"{fmt_num(None if share is None else 100 * share, '.0f')}% |")
    return "\n".join(lines)


def plan_lines(result: dict[str, Any]) -> str:
    """Where adaptive's requests went by the pool they found (``plan_shares``, all
    repeats): the share on the most accurate variant of those that found the pool idle
    and that it serves in time alone (accurate-only's in-time requests), and how many
    it could not serve alone or found the pool busy."""
    lines = ["| process | ρ | requests | idle pool, accurate fits alone: share of requests, "
             "on accurate | idle pool, too long for it | busy pool: share, on accurate | "
             "plan reasons |", "|---|---|---|---|---|---|---|"]
    for row in result["table"]:
        plan = row.get("plan")
        if row["policy"] != "adaptive" or not plan:
            continue
        n = sum(plan[k]["n"] for k in ("idle_fits", "idle_too_long", "busy")) or 1
        fits, busy = plan["idle_fits"], plan["busy"]
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(plan["reasons"].items(),
                                                           key=lambda kv: -kv[1]))
        lines.append(
            f"| {process_of(row)} | {row['rho']} | {n} | {fits['n'] / n:.0%}, "
            f"{fmt_num(ratio(fits['on_best'], fits['n']), '.1%')} | "
            f"{plan['idle_too_long']['n'] / n:.0%} | {busy['n'] / n:.0%}, "
            f"{fmt_num(ratio(busy['on_best'], busy['n']), '.0%')} | {reasons} |")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    processes = [p for p in PROCESSES if any(r.get("process", "poisson") == p
                                             for r in result["table"])]
    fig, axes = plt.subplots(len(processes), 2, figsize=(11, 4 * len(processes)),
                             squeeze=False)
    for (a, b), process in zip(axes, processes, strict=True):
        for policy in POLICIES:
            rows = [r for r in result["table"] if r["policy"] == policy
                    and r.get("process", "poisson") == process]
            if not rows:
                continue
            x = [r["rho"] for r in rows]
            y = [r["goodput_mean"] for r in rows]
            err = [[r["goodput_mean"] - r["goodput_min"] for r in rows],
                   [r["goodput_max"] - r["goodput_mean"] for r in rows]]
            line = a.errorbar(x, y, yerr=err, marker="o", capsize=3, label=policy)
            color = line[0].get_color()
            b.plot(x, [r["mix_accuracy"] for r in rows], marker="o", color=color,
                   label=policy)
            b.scatter(x, [r["served_accuracy"] for r in rows], marker="x", color=color,
                      alpha=0.5)
        a.set_xlabel(f"offered load ρ (× accurate-only capacity), {process} arrivals")
        a.set_ylabel(f"goodput (answers within {result['deadline_ms']:.0f} ms, /s)")
        a.legend()
        a.grid(alpha=0.3)
        b.set_xlabel(f"offered load ρ, {process} arrivals")
        b.set_ylabel("accuracy of the traffic served")
        b.set_title("line: frontier accuracy × variant mix; ×: measured against labels",
                    fontsize=9)
        b.grid(alpha=0.3)
        b.legend()
    fig.suptitle(f"sentiment group: {', '.join(result['variants'])}; "
                 f"capacity {result['capacity_per_s']:.0f}/s, {result['cores']} cores")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
