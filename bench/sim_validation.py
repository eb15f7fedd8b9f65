"""Validation: the simulator against the real server, same workload, same seed.

For each system (the synthetic backend, the packaged Gemma 3 270M through llama.cpp, the
ONNX ``sentiment`` variant group), on 127.0.0.1, one at a time.

The two generative systems (``run_system``):

1. **closed-loop profile through the serving path** (streaming completions at
   concurrency 1, 2, 4, 8, lone short and long prompts): TPOT at concurrency ``c`` is a
   step of ``c`` decodes, a lone TTFT a prefill step plus the time outside the worker.
   Kept as a comparison (``sim_closed_loop_profile``): steps in a closed loop are not
   the steps of open-loop arrivals, which mix prefills and admissions into decodes;
2. **capacity**: a closed loop at concurrency = the sequence slots (requests/s);
3. **calibration**: open-loop Poisson arrivals at 0.8 × capacity with *another seed* than
   the validation points; the cost file (``calibration.costs`` in the JSON; with
   ``--write-costs`` also ``examples/sim_cost_<system>.json``, a ``--costs`` file) is
   what the server did under that load: the step-time model its
   engine learned from the steps it ran (``/status.json``: ``OnlineStepCost``), and the
   mean time a request spent outside the runtime (the client's TTFT less the server's,
   from the JSON access log: HTTP, tokenizing, streaming back). A system with
   ``step_table`` (Gemma: decode steps not linear in their decodes) has instead the
   steps its engine ran in that run by decodes and prefill (``/status.json``:
   ``step_times``, the tally's difference over the run), with the closed-loop fit for
   the cost of a prompt token beyond a bucket's mean;
4. for each load factor (0.5, 0.8, 0.95, 1.3 × capacity): one Poisson arrival list
   (seeded), each request with ``x-sluice-deadline-ms``; the real server gets it open
   loop over HTTP, the simulator the same arrivals (prompt token counts from the server's
   ``/tokenize``). Compared: TTFT p95 of completed requests and goodput (the share of
   requests completed by their deadline), with the tolerance (15 %) on each. Each point
   also records the steps the engine ran (``step_times``), where the real TTFT went
   (front end, queue wait) and the step model the
   engine had learned by then. A system with ``step_table`` is predicted *ahead of*
   each point (``sim``, judged): before its arrivals start, from a rolling table of the
   steps the engine ran just before it (``sluice.engine.step_times.recent``: per
   bucket, the newest runs' steps until it holds ``--rolling-min-steps``; the
   calibration for the first point, then each point's steps over it), since the
   machine's step speed moves between runs minutes apart; ``sim_calibration`` is the
   calibration's cost file alone, ``sim_own_steps`` the point's own steps (after the
   fact: the model's error apart from any calibration's). Each run also records its
   steps every 10 s (``step_times_series``).

The variant group (``run_onnx``): the profile ``sluice profile`` wrote is the cost model
(batch times by batch size, and how they grow with a batch's longest input: its length
fit), each arrival carrying the length of the text the real run sends it; end-to-end
p95 and goodput at the same four loads of the accurate variant's capacity. Predicted
(``sim``, judged) before each point's arrivals start, with what the server's planner
had learned by then of each variant's speed (``/status.json``'s ``estimate``: the
profile × its drift, faster or slower); ``sim_profile`` charges the profile as
measured (a slower machine only as ``overhead_ms``).

Writes bench/results/sim_validation.json and .png (a system not run keeps its last
result). One system a run, alone on the host:

    python bench/sim_validation.py --systems synthetic
    python bench/sim_validation.py --systems gemma --duration 30 \
        --calibration-s 60
    python bench/sim_validation.py --systems onnx --duration 30
    (a fresh profile first, beside the prepared one: ``sluice profile --cache DIR
    --config DIR/sluice.toml --out P``, then ``--onnx-profile P``)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.loadgen import Sample, closed_loop, stream_completion
from bench.lib.model_tables import llm_toml, synthetic_toml
from bench.lib.prompts import LLM_PROMPTS, SYNTH_PROMPTS
from bench.lib.servers import free_port, running, sluice_cmd
from bench.lib.simulated import access_lines, front_end_summary, p95, pct, rel_err, token_counts
from sluice.cli.costs import live_costs, model_tallies, read_status
from sluice.config import Config
from sluice.engine.step_times import StepBucket, from_json, minus, recent, to_json
from sluice.policy.step.step_cost import StepCost, StepSample, fit_step_cost
from sluice.sim import Arrival, SimConfig, generate, parse_spec, simulate
from sluice.sim.costs import read_costs

T = TypeVar("T")
RESULTS = Path(__file__).resolve().parent / "results"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
FACTORS = (0.5, 0.8, 0.95, 1.3)
TOLERANCE = 0.15
CALIBRATION_FACTOR = 0.8
"""Load of the calibration run the cost file is measured in (its own seed)."""
PROFILE_CONCURRENCY = (1, 2, 4, 8)
ROLLING_MIN_STEPS = 30
"""A bucket of the rolling table (``sluice.engine.step_times.recent``) sums the newest
runs' steps until it holds this many (chosen before the runs, not fitted to them)."""

SYSTEMS: dict[str, dict[str, Any]] = {
    "synthetic": {"toml": synthetic_toml, "model": "synth-chat", "prompts": SYNTH_PROMPTS,
                  "max_tokens": 16, "slots": 8},
    "gemma": {"toml": llm_toml, "model": "gemma-3-270m", "prompts": LLM_PROMPTS,
              "max_tokens": 32, "slots": 8, "step_table": True},
}


async def profile(base: str, system: dict[str, Any], n_short: int, n_long: int
                  ) -> tuple[StepCost, float, float, list[dict[str, Any]]]:
    """The step-time model and the per-request overhead, through the serving path.

    TPOT at concurrency ``c`` is one step of ``c`` decodes: those samples, and the same
    decodes over long prompts, fit the base, per-decode and per-context-token seconds
    (``fit_step_cost``). TTFT of a lone request is the overhead
    outside the worker (HTTP, tokenization, streaming) plus one prefill step; lone short
    and long prompts give the per-prefill-token seconds (their difference) and then the
    overhead (what the short prompt's TTFT leaves after its step). The spread of the gaps
    between a request's tokens with every slot busy is the spread of step times (``cv``)."""
    m, model = system["max_tokens"], system["model"]
    decodes: list[StepSample] = []
    rows: list[dict[str, Any]] = []
    cv = 0.0
    for c in PROFILE_CONCURRENCY:
        got, _ = await closed_loop(base, model, system["prompts"], concurrency=c,
                                   n_requests=max(8, 3 * c), max_tokens=m)
        tpot = statistics.median(s.tpot_s for s in got if s.ok and s.tpot_s is not None)
        decodes.append(StepSample(c, 0, tpot, c * (n_short + m // 2)))
        cvs = [s.itl_cv for s in got if s.ok and s.itl_cv is not None]
        cv = statistics.median(cvs) if cvs else 0.0  # the last: every slot busy
        rows.append({"concurrency": c, "tpot_s": round(tpot, 6), "itl_cv": round(cv, 4)})
    c = PROFILE_CONCURRENCY[-1]  # the same decodes over long prompts: the context's cost
    got, _ = await closed_loop(base, model, long_prompts(system), concurrency=c,
                               n_requests=c, max_tokens=m)
    tpot = statistics.median(s.tpot_s for s in got if s.ok and s.tpot_s is not None)
    decodes.append(StepSample(c, 0, tpot, c * (n_long + m // 2)))
    rows.append({"concurrency": c, "long_prompts": True, "tpot_s": round(tpot, 6)})
    ttft = {}
    for label, prompts in (("short", system["prompts"]), ("long", long_prompts(system))):
        got, _ = await closed_loop(base, model, prompts, concurrency=1, n_requests=8,
                                   max_tokens=2)
        ttft[label] = statistics.median(s.ttft_s for s in got if s.ok and s.ttft_s is not None)
    decode_fit = fit_step_cost(decodes, with_context=True)
    per_prefill_s = max(0.0, (ttft["long"] - ttft["short"]) / max(1, n_long - n_short))
    step = StepCost(decode_fit.base_s, decode_fit.per_decode_token_s, per_prefill_s,
                    decode_fit.per_context_token_s)
    overhead_s = max(0.0, ttft["short"] - step.predict_s(0, n_short))
    rows.append({"ttft_short_s": round(ttft["short"], 6), "ttft_long_s": round(ttft["long"], 6),
                 "n_short": n_short, "n_long": n_long})
    return step, overhead_s, cv, rows


def long_prompts(system: dict[str, Any]) -> list[str]:
    """The prompts, each eight times over (a prefill about eight times longer)."""
    return [" ".join([p] * 8) for p in system["prompts"]]


async def open_loop_arrivals(base: str, model: str, prompts: list[str], arrivals: list[Arrival],
                             prompt_of: list[int], deadline_ms: float, tag: str
                             ) -> tuple[list[Sample], list[float], dict[str, Any] | None]:
    """Send the arrivals open loop; each request carries ``x-request-id: <tag>-<index>``
    (its access-log line). Returns the samples, each request's send lag (seconds it left
    after its scheduled time: the load generator's own delay), and the step-time model
    the engine had learned when the last request was sent (still under the load)."""
    limits = httpx.Limits(max_connections=len(arrivals) + 4)
    lags: list[float] = []
    async with httpx.AsyncClient(limits=limits) as client:
        t0 = time.perf_counter()
        tasks = []
        for k, (a, i) in enumerate(zip(arrivals, prompt_of, strict=True)):
            delay = t0 + a.time_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            lags.append(time.perf_counter() - t0 - a.time_s)
            headers = {"x-sluice-deadline-ms": f"{deadline_ms:.0f}",
                       "x-request-id": f"{tag}-{k}"}
            tasks.append(asyncio.create_task(stream_completion(
                client, base, model, prompts[i], a.output_tokens, headers=headers)))
        learned = learned_step_cost((await client.get(f"{base}/status.json")).json(), model)
        return list(await asyncio.gather(*tasks)), lags, learned


def learned_step_cost(status: dict[str, Any], model: str) -> dict[str, Any] | None:
    """The step-time model the engine of ``model`` learned (``/status.json``), with the
    number of recent steps it was fitted on."""
    for w in status["workers"]:
        for m in w["models"]:
            if m["model_id"] == model and m.get("step_cost"):
                return {"step_cost": m["step_cost"], "steps": m["step_samples"]}
    return None


def step_tally(base: str, model: str) -> dict[str, StepBucket]:
    """The engine's tally of every step it ran since ``model`` loaded, by decodes and
    whether it fed a prompt (``/status.json``: ``step_times``)."""
    status = read_status(base)
    return model_tallies(status).get(model, {})


def real_summary(samples: list[Sample], max_tokens: int) -> dict[str, Any]:
    done = [s for s in samples if s.ok and s.tokens == max_tokens]
    states = {"completed": len(done),
              "rejected": sum(s.status in (429, 503) for s in samples),
              "expired": sum(s.status == 200 and s.error is not None and "deadline" in s.error
                             for s in samples)}
    states["other"] = len(samples) - sum(states.values())
    counted = {id(s) for s in done} | {id(s) for s in samples if s.status in (429, 503) or (
        s.status == 200 and s.error is not None and "deadline" in s.error)}
    others = Counter(  # what "other" was: an error, or a stream short of max_tokens
        f"{s.status} {s.error[:90]}" if s.error else f"{s.status} ok, {s.tokens} tokens"
        for s in samples if id(s) not in counted)
    ttft = [s.ttft_s for s in done if s.ttft_s is not None]
    return {"offered": len(samples), "states": states,
            "goodput": len(done) / len(samples) if samples else None,
            "ttft_p95_s": p95(ttft), "e2e_p95_s": p95([s.latency_s for s in done]),
            "ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99),
            "tpot_p50_s": pct([s.tpot_s for s in done if s.tpot_s is not None], 50),
            "other_kinds": dict(others.most_common(5))}


def sim_summary(config: SimConfig, arrivals: list[Arrival]) -> dict[str, Any]:
    report, _ = simulate(config, arrivals)
    o = report["overall"]
    return {"offered": o["offered"], "states": o["states"], "goodput": o["goodput"],
            "ttft_p95_s": o["ttft_s"]["p95"], "e2e_p95_s": o["e2e_s"]["p95"],
            "ttft_p50_s": o["ttft_s"]["p50"], "ttft_p99_s": o["ttft_s"]["p99"],
            "tpot_p50_s": o["tpot_s"]["p50"]}


def judge(point: dict[str, Any], sim: dict[str, Any], real: dict[str, Any],
          latency_key: str) -> None:
    """Adds to ``point`` the simulator's relative errors on ``latency_key`` (a p95, e.g.
    ``ttft_p95_s``, stored as ``ttft_p95_rel_err``) and on goodput, and whether both are
    within ``TOLERANCE``."""
    latency_err = f"{latency_key.removesuffix('_s')}_rel_err"
    point[latency_err] = rel_err(sim[latency_key], real[latency_key])
    point["goodput_rel_err"] = rel_err(sim["goodput"], real["goodput"])
    point["within_tolerance"] = all(e is not None and abs(e) <= TOLERANCE
                                    for e in (point[latency_err], point["goodput_rel_err"]))


def poisson_arrivals(system: dict[str, Any], rate: float, duration_s: float, seed: int,
                     deadline_ms: float, counts: list[int]) -> tuple[list[Arrival], list[int]]:
    """Seeded Poisson arrivals, prompts in turn (their token counts from the server).
    Requests sending the same prompt share it as a prefix (``prefix_id``: the prompt),
    as they do in the server, whose engine copies a running or retained sequence's KV
    for it instead of computing it again (the steps that fed a prompt fed 1-8 tokens of
    the prompts' 14-18 on average)."""
    spec = parse_spec(f"poisson:rate={rate},duration={duration_s},model={system['model']},"
                      f"output={system['max_tokens']},deadline_ms={deadline_ms}")
    arrivals = list(generate(spec, seed=seed))
    prompt_of = [i % len(system["prompts"]) for i in range(len(arrivals))]
    return ([replace(a, prompt_tokens=counts[i], prefix_id=i, prefix_tokens=counts[i])
             for a, i in zip(arrivals, prompt_of, strict=True)], prompt_of)


def measure_open_loop(base: str, system: dict[str, Any], arrivals: list[Arrival],
                      prompt_of: list[int], deadline_ms: float, tag: str, log: Path
                      ) -> dict[str, Any]:
    """One open-loop run against the real server: the client's summary, where the time
    went (``front_end``), the step-time model the engine learned under the load, and
    the steps the engine ran during the run (``step_times``: its tally's difference)."""
    before = step_tally(base, system["model"])
    (samples, lags, learned), series = asyncio.run(with_tally_series(
        base, system["model"], open_loop_arrivals(
            base, system["model"], system["prompts"], arrivals, prompt_of, deadline_ms, tag)))
    real = real_summary(samples, system["max_tokens"])
    time.sleep(2.0)  # let the server drain (and write its access lines)
    real["front_end"] = front_end_summary(samples, access_lines(log, tag), lags)
    real["learned_step_cost"] = learned
    real["step_times"] = to_json(minus(step_tally(base, system["model"]), before))
    real["step_times_series"] = [
        {"t_s": t, "step_times": to_json(minus(snap, prev))}
        for (t, snap), prev in zip(series, [before, *(snap for _, snap in series[:-1])],
                                   strict=True)]
    return real


SERIES_EVERY_S = 10.0
"""How often a run's steps are read while it runs (``step_times_series``: how the
machine's step speed moves within and between runs)."""


async def with_tally_series(base: str, model: str, run: Awaitable[T]
                            ) -> tuple[T, list[tuple[float, dict[str, StepBucket]]]]:
    """``run``'s result, and the engine's tally read every ``SERIES_EVERY_S`` while it
    ran (and once at its end): ``(seconds since the start, cumulative tally)``."""
    series: list[tuple[float, dict[str, StepBucket]]] = []
    done = asyncio.Event()

    async def poll() -> None:
        t0 = time.perf_counter()
        async with httpx.AsyncClient(timeout=30.0) as client:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), SERIES_EVERY_S)
                status = (await client.get(f"{base}/status.json")).json()
                series.append((round(time.perf_counter() - t0, 2),
                               model_tallies(status).get(model, {})))
                if done.is_set():
                    return

    poller = asyncio.create_task(poll())
    try:
        result = await run
    finally:
        done.set()
        await poller
    return result, series


def run_system(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Profile, capacity, calibration, then the four loads (see the module docstring)."""
    system = SYSTEMS[name]
    toml = system["toml"]()
    port = free_port()
    cmd, cfg_path = sluice_cmd(toml, port)
    cmd = [*cmd, "--log-level", "info", "--log-format", "json"]  # access lines (last wins)
    base = f"http://127.0.0.1:{port}"
    from sluice.config import load_config

    config: Config = load_config(cfg_path)
    out: dict[str, Any] = {"system": name, "model": system["model"],
                           "duration_s": args.duration, "points": []}
    log = RESULTS / f".sim_validation_{name}.log"
    with running(cmd, f"{base}/ready", log_path=log):
        counts = asyncio.run(token_counts(base, system["model"], system["prompts"]))
        long_counts = asyncio.run(token_counts(base, system["model"], long_prompts(system)))
        n_short = round(statistics.fmean(counts))
        fitted, overhead_s, cv, rows = asyncio.run(
            profile(base, system, n_short, round(statistics.fmean(long_counts))))
        profile_costs = {system["model"]: {"step_cost": fitted.to_json(),
                                           "overhead_ms": round(overhead_s * 1000, 3),
                                           "cv": round(cv, 4)}}
        out["profile"] = {"measured": rows, "fitted": fitted.to_json(),
                          "overhead_s": round(overhead_s, 6), "cv": round(cv, 4),
                          "prompt_tokens": counts}
        slots = system["slots"]
        got, wall = asyncio.run(closed_loop(base, system["model"], system["prompts"],
                                            concurrency=slots, n_requests=slots * args.rounds,
                                            max_tokens=system["max_tokens"]))
        capacity = sum(s.ok for s in got) / wall
        full_latency = statistics.median(s.latency_s for s in got if s.ok)
        deadline_ms = args.deadline_factor * full_latency * 1000
        out.update(capacity_per_s=round(capacity, 3), deadline_ms=round(deadline_ms, 1),
                   full_latency_s=round(full_latency, 4))
        print(f"[{name}] closed-loop profile {fitted}, overhead {overhead_s * 1000:.1f} ms; "
              f"capacity {capacity:.2f}/s; deadline {deadline_ms:.0f} ms", flush=True)
        # Calibration: other arrivals (another seed) at CALIBRATION_FACTOR x capacity; the
        # cost file is what the server did under that load: the step-time model its engine
        # learned, and the mean time a request spent outside the runtime (front end)
        arrivals, prompt_of = poisson_arrivals(system, CALIBRATION_FACTOR * capacity,
                                               args.calibration_s, args.seed + 1000,
                                               deadline_ms, counts)
        calib = measure_open_loop(base, system, arrivals, prompt_of, deadline_ms, "calib", log)
        learned = calib["learned_step_cost"]
        front_mean_s = calib["front_end"]["front_s"]["mean"]
        if learned is None or front_mean_s is None:
            raise RuntimeError(f"[{name}] calibration measured nothing: {calib}")
        costs = {system["model"]: {"step_cost": learned["step_cost"],
                                   "overhead_ms": round(front_mean_s * 1000, 3),
                                   "cv": round(cv, 4)}}
        if system.get("step_table"):
            # decode steps not linear in their decodes (a step beside prefills is slower): the steps
            # the engine ran in the calibration run, by decodes and whether they fed a
            # prompt, are the tables (sluice.sim.costs.step_tables); the closed-loop fit
            # gives the cost of a prompt token beyond a table's mean and the line for
            # steps no table covers
            costs[system["model"]].update(step_cost=fitted.to_json(),
                                          step_times=calib["step_times"])
        if args.write_costs:  # else the committed one (docs/operations.md plans with it) stays
            (EXAMPLES / f"sim_cost_{name}.json").write_text(json.dumps(costs, indent=2) + "\n")
        out["calibration"] = {"factor": CALIBRATION_FACTOR, "seed": args.seed + 1000,
                              "duration_s": args.calibration_s, "requests": len(arrivals),
                              "real": calib, "costs": costs[system["model"]]}
        print(f"[{name}] calibrated at {CALIBRATION_FACTOR}x: learned {learned}, front end "
              f"{front_mean_s * 1000:.1f} ms; steps (count, mean ms) "
              f"{ {k: (b['steps'], b['mean_ms']) for k, b in calib['step_times'].items()} }",
              flush=True)
        sims = {"sim": SimConfig.from_config(config, costs),
                "sim_closed_loop_profile": SimConfig.from_config(config, profile_costs)}
        if name == "synthetic":
            sims["sim_declared_cost"] = SimConfig.from_config(config)
        if system.get("step_table"):  # judged: the rolling table below
            sims = {"sim_calibration": sims["sim"],
                    "sim_closed_loop_profile": sims["sim_closed_loop_profile"]}
        windows = [from_json(calib["step_times"])]  # each run's steps so far, oldest first
        for factor in args.factors:
            rate = factor * capacity
            arrivals, prompt_of = poisson_arrivals(system, rate, args.duration, args.seed,
                                                   deadline_ms, counts)
            tag = f"x{factor:g}".replace(".", "_")
            point: dict[str, Any] = {"factor": factor, "rate_per_s": round(rate, 3),
                                     "requests": len(arrivals)}
            if system.get("step_table"):
                # predicted before the point's arrivals start, from the steps the engine
                # ran just before it: the calibration, then each point's steps over it
                rolling = recent(windows, args.rolling_min_steps)
                point["rolling_step_times"] = to_json(rolling)
                point["sim"] = sim_summary(SimConfig.from_config(config, {
                    system["model"]: dict(costs[system["model"]],
                                          step_times=point["rolling_step_times"])}), arrivals)
            real = measure_open_loop(base, system, arrivals, prompt_of, deadline_ms, tag, log)
            point["real"] = real
            windows.append(from_json(real["step_times"]))
            for key, sim_config in sims.items():
                point[key] = sim_summary(sim_config, arrivals)
            if system.get("step_table"):
                # the model's error apart from the calibration's: the steps the engine
                # ran at this very point as the cost file
                own = {system["model"]: dict(costs[system["model"]],
                                             step_times=real["step_times"])}
                point["sim_own_steps"] = sim_summary(SimConfig.from_config(config, own),
                                                     arrivals)
            sim = point["sim"]
            judge(point, sim, real, "ttft_p95_s")
            out["points"].append(point)
            print(f"[{name}] {factor}x ({rate:.1f}/s, n={len(arrivals)}): TTFT p95 real "
                  f"{fmt(real['ttft_p95_s'])} sim {fmt(sim['ttft_p95_s'])} (closed-loop "
                  f"profile {fmt(point['sim_closed_loop_profile']['ttft_p95_s'])}, "
                  f"calibration alone "
                  f"{fmt(point.get('sim_calibration', {}).get('ttft_p95_s'))}, own steps "
                  f"{fmt(point.get('sim_own_steps', {}).get('ttft_p95_s'))}); goodput "
                  f"real {real['goodput']:.3f} sim {sim['goodput']:.3f}; TPOT p50 real "
                  f"{fmt(real['tpot_p50_s'])} sim {fmt(sim['tpot_p50_s'])}; states real "
                  f"{real['states']} sim {sim['states']}; ok={point['within_tolerance']}",
                  flush=True)
    return out


VARIANTS_DIR = Path("/root/.cache/sluice-planner/variants")
"""What ``sluice prepare`` and ``sluice profile`` wrote: ``sluice.toml`` (the six variants
of each group), ``profile.json`` (batch times: the simulator's cost model), ``data/``."""
GROUP = "sentiment"


async def infer(client: httpx.AsyncClient, base: str, text: str, deadline_ms: float | None,
                request_id: str | None = None, model: str = GROUP) -> dict[str, Any]:
    """One ``/v1/infer`` call (to the group by default); status, latency, the variant that
    served."""
    body: dict[str, Any] = {"model": model, "input": text}
    if deadline_ms is not None:
        body["deadline_ms"] = deadline_ms
    headers = {"x-request-id": request_id} if request_id else None
    t0 = time.perf_counter()
    try:
        r = await client.post(f"{base}/v1/infer", json=body, headers=headers, timeout=60.0)
    except httpx.HTTPError as exc:
        return {"status": 0, "latency_s": time.perf_counter() - t0,
                "error": type(exc).__name__}
    out: dict[str, Any] = {"status": r.status_code, "latency_s": time.perf_counter() - t0,
                           "variant": r.headers.get("x-sluice-variant"),
                           "plan_reason": r.headers.get("x-sluice-plan-reason"),
                           "plan_arrival": r.headers.get("x-sluice-plan-arrival"),
                           "batch_size": int(r.headers.get("x-sluice-batch-size") or 0),
                           "run_ms": float(r.headers.get("x-sluice-run-ms") or 0.0)}
    if r.status_code != 200:
        try:
            out["error"] = r.json()["error"]["code"]
        except (ValueError, KeyError, TypeError):
            out["error"] = r.text[:80]
    return out


async def oneshot_closed_loop(base: str, model: str, texts: list[str], concurrency: int,
                              duration_s: float) -> float:
    """Completions per second with ``concurrency`` requests always outstanding."""
    done = 0
    end = time.perf_counter() + duration_s
    async with httpx.AsyncClient() as client:
        async def user(k: int) -> None:
            nonlocal done
            i = k
            while time.perf_counter() < end:
                i += concurrency
                got = await infer(client, base, texts[i % len(texts)], None, model=model)
                if got["status"] == 200:
                    done += 1
        t0 = time.perf_counter()
        await asyncio.gather(*(user(k) for k in range(concurrency)))
        return done / (time.perf_counter() - t0)


async def oneshot_open_loop(base: str, texts: list[str], arrivals: list[Arrival],
                            deadline_ms: float, tag: str) -> list[dict[str, Any]]:
    limits = httpx.Limits(max_connections=len(arrivals) + 4)
    async with httpx.AsyncClient(limits=limits) as client:
        t0 = time.perf_counter()
        tasks = []
        for k, a in enumerate(arrivals):
            delay = t0 + a.time_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(infer(client, base, texts[k % len(texts)],
                                                   deadline_ms, f"{tag}-{k}")))
        return list(await asyncio.gather(*tasks))


def oneshot_real_summary(samples: list[dict[str, Any]], deadline_s: float) -> dict[str, Any]:
    ok = [s for s in samples if s["status"] == 200]
    lat = [s["latency_s"] for s in ok]
    states = Counter("completed" if s["status"] == 200 else
                     "rejected" if s["status"] in (429, 503) else
                     "expired" if s.get("error") == "deadline" else "other" for s in samples)
    mix = Counter(s["variant"] for s in ok)
    good = sum(s["latency_s"] <= deadline_s for s in ok)
    return {"offered": len(samples), "states": dict(states),
            "goodput": good / len(samples) if samples else None,
            "e2e_p95_s": p95(lat), "e2e_p50_s": pct(lat, 50), "e2e_p99_s": pct(lat, 99),
            "variant_mix": dict(mix.most_common()),
            "plan_reasons": plan_reasons((s["variant"], s.get("plan_reason")) for s in ok),
            "batches": batch_summary((s["variant"], s["batch_size"], s["run_ms"] / 1000.0)
                                     for s in ok),
            "decisions": [decision(s.get("plan_reason"), s.get("plan_arrival"))
                          for s in samples],
            "other_kinds": dict(Counter(str(s.get("error")) for s in samples
                                        if s["status"] != 200).most_common(5))}


def oneshot_sim_summary(config: SimConfig, arrivals: list[Arrival], decisions: bool = True
                        ) -> dict[str, Any]:
    report, fleet = simulate(config, arrivals, keep_requests=True)
    o = report["overall"]
    done = [r for r in fleet.requests or () if r.status == "completed"]
    return {"offered": o["offered"], "states": o["states"], "goodput": o["goodput"],
            "e2e_p95_s": o["e2e_s"]["p95"], "e2e_p50_s": o["e2e_s"]["p50"],
            "e2e_p99_s": o["e2e_s"]["p99"],
            "variant_mix": report["variant_mix"].get(GROUP, {}),
            "plan_reasons": plan_reasons((r.model, r.plan_reason) for r in done),
            "batches": batch_summary((r.model, r.batch_size,
                                      (r.end_s or 0.0) - (r.started_s or 0.0)) for r in done),
            "decisions": [decision(r.plan_reason, r.plan_arrival) for r in
                          sorted(fleet.requests or (), key=lambda r: r.request_id)]
            if decisions else None}


def decision(reason: str | None, arrival: str | tuple[float, float, float] | None) -> str:
    """One request's plan, in arrival order, as one short string: its reason and the
    low-load test's inputs (arrival rate, its standard error, the line; per second;
    ``x-sluice-plan-arrival``), e.g. ``"low_load 8.333 1.667 9.1"``."""
    if isinstance(arrival, str):
        arrival = tuple(float(x) for x in arrival.split())  # type: ignore[assignment]
    return " ".join([str(reason), *(f"{x:.3f}" for x in arrival or ())])


def plan_reasons(choices: Iterable[tuple[str, str | None]]) -> dict[str, dict[str, int]]:
    """Per planner reason (``x-sluice-plan-reason``; ``replanned``: moved while queued),
    the completed requests each variant got for it: where the server's and the
    simulator's planners decided differently."""
    by: dict[str, Counter[str]] = {}
    for variant, reason in choices:
        by.setdefault(str(reason), Counter())[variant] += 1
    return {r: dict(c.most_common()) for r, c in sorted(by.items())}


def batch_summary(runs: Iterable[tuple[str, int, float]]) -> dict[str, dict[str, Any]]:
    """Per variant, from each completed request's (variant, batch size, run seconds):
    how many requests ran in batches of each size, and their run time's mean and p95."""
    by: dict[str, list[tuple[int, float]]] = {}
    for variant, size, seconds in runs:
        by.setdefault(variant, []).append((size, seconds))
    return {v: {"requests_by_batch_size": dict(sorted(Counter(b for b, _ in xs).items())),
                "run_mean_ms": round(statistics.fmean(s for _, s in xs) * 1000, 1),
                "run_p95_ms": round(float(np.percentile([s for _, s in xs], 95)) * 1000, 1)}
            for v, xs in sorted(by.items())}


def run_onnx(args: argparse.Namespace) -> dict[str, Any]:
    """The ``sentiment`` variant group (six ONNX variants, adaptive planner) against the
    simulator with the profile's batch times as its cost model. Capacity: what the most
    accurate variant alone completes per second, one request at a time (its most efficient
    batch size on one thread: batch 2 takes more than twice batch 1); deadline: 1.5 × its
    batch-of-8 time, as bench/goodput_sweep.py.
    Compared: end-to-end p95 of answered requests and goodput (answered within the
    deadline / offered). Every variant is loaded before measuring (admin API), and the
    simulator starts with them resident."""
    from sluice import prep
    from sluice.config import load_config

    profile_path = args.onnx_profile or args.variants_dir / "profile.json"
    manifest = prep.load_manifest(args.variants_dir)
    cfg_path = Path(tempfile.mkdtemp(prefix="sluice-simval-")) / "sluice.toml"
    prep.write_config(manifest, cfg_path, profile=json.loads(profile_path.read_text()))
    config: Config = load_config(cfg_path)  # the planner's prior: the same profile
    rows = [json.loads(line) for line in Path(manifest["test_file"]).read_text().splitlines()]
    texts = [r["text"] for r in rows]
    random.Random(7).shuffle(texts)
    group = next(g for g in config.runtime_config().groups if g.group_id == GROUP)
    variants = list(group.variants)
    profile = json.loads(profile_path.read_text())
    accurate_ms = profile["variants"][variants[0].removeprefix(f"{GROUP}-")]["batch_ms"]
    deadline_ms = round(1.5 * float(accurate_ms["8"]))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "sluice.cli", "serve", "-c", str(cfg_path), "--port",
           str(port), "--log-level", "info", "--log-format", "json", "--open-admin"]
    costs = read_costs(profile_path)
    out: dict[str, Any] = {"system": "onnx", "model": GROUP, "variants": variants,
                           "deadline_ms": deadline_ms, "profile": str(profile_path),
                           "duration_s": args.duration, "points": []}
    log = RESULTS / ".sim_validation_onnx.log"
    with running(cmd, f"{base}/ready", log_path=log):
        with httpx.Client(timeout=120.0) as client:
            for v in variants:
                client.post(f"{base}/admin/models/{v}/load").raise_for_status()
        capacity = asyncio.run(oneshot_closed_loop(base, variants[0], texts, 1,
                                                   args.capacity_s))
        # one request at a time: what a request spends outside its batch of one (HTTP,
        # parsing, tokenizing) is its time less the profiled batch (``sim_profile``), or
        # less the batch of one the server's planner now predicts (``sim``: its estimate
        # learned from the capacity run's batches, faster or slower than the profile)
        overhead_s = max(0.0, 1.0 / capacity - float(accurate_ms["1"]) / 1000.0)
        for entry in costs.values():
            entry["overhead_ms"] = round(overhead_s * 1000.0, 3)
        sim_config = replace(SimConfig.from_config(config, costs), preload=tuple(variants))
        live = live_costs(None, read_status(base), costs)
        live_batch1_s = SimConfig.from_config(config, live).models[variants[0]].cost.batch_s(1)
        live_overhead_ms = round(max(0.0, 1.0 / capacity - live_batch1_s) * 1000.0, 3)
        out.update(capacity_per_s=round(capacity, 3), overhead_ms=round(overhead_s * 1000, 3),
                   live_overhead_ms=live_overhead_ms,
                   live_batch1_ms=round(live_batch1_s * 1000, 3))
        print(f"[onnx] capacity {capacity:.2f}/s ({variants[0]} alone), {overhead_s * 1000:.1f}"
              f" ms a request outside the profiled batch ({live_overhead_ms:.1f} outside the "
              f"live estimate's {live_batch1_s * 1000:.1f} ms); deadline {deadline_ms} ms",
              flush=True)
        for factor in args.factors:
            rate = factor * capacity
            spec = parse_spec(f"poisson:rate={rate},duration={args.duration},model={GROUP},"
                              f"deadline_ms={deadline_ms}")
            # each arrival's input length: the text the real run sends it
            arrivals = [replace(a, input_chars=len(texts[k % len(texts)]))
                        for k, a in enumerate(generate(spec, seed=args.seed))]
            tag = f"o{factor:g}".replace(".", "_")
            # predicted from the server's planner state as the arrivals start (read just
            # before them, simulated after): what it has learned of each variant's speed
            # (its recent batches: the run before) and the group's recent arrivals (the
            # previous point's tail or the capacity run, which its rate meter still holds)
            status = read_status(base)
            samples = asyncio.run(oneshot_open_loop(base, texts, arrivals, deadline_ms, tag))
            live = live_costs(None, status, costs)
            for entry in live.values():
                entry["overhead_ms"] = live_overhead_ms
            groups = status.get("groups", {})
            sim = oneshot_sim_summary(replace(SimConfig.from_config(config, live),
                                              preload=tuple(variants)).with_arrivals(groups),
                                      arrivals)
            time.sleep(2.0)
            real = oneshot_real_summary(samples, deadline_ms / 1000.0)
            point = {"factor": factor, "rate_per_s": round(rate, 3), "requests": len(arrivals),
                     "estimates": {v: live[v].get("estimate") for v in variants},
                     "arrivals_before": groups.get(GROUP, {}).get("arrivals"),
                     "real": real, "sim": sim,
                     "sim_profile": oneshot_sim_summary(sim_config.with_arrivals(groups),
                                                        arrivals, decisions=False)}
            judge(point, sim, real, "e2e_p95_s")
            out["points"].append(point)
            print(f"[onnx] {factor}x ({rate:.1f}/s, n={len(arrivals)}): e2e p95 real "
                  f"{fmt(real['e2e_p95_s'])} sim {fmt(sim['e2e_p95_s'])} (profile "
                  f"{fmt(point['sim_profile']['e2e_p95_s'])}); drift "
                  f"{ {v: round(e['drift'] or 1, 3) for v, e in point['estimates'].items() if e} }"
                  f"; goodput real "
                  f"{real['goodput']:.3f} sim {sim['goodput']:.3f}; mix real "
                  f"{real['variant_mix']} sim {sim['variant_mix']}; reasons real "
                  f"{real['plan_reasons']} sim {sim['plan_reasons']}; ok="
                  f"{point['within_tolerance']}; batches real {real['batches']} sim "
                  f"{sim['batches']}", flush=True)
    return out


def fmt(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(results), figsize=(5.5 * len(results), 7), squeeze=False)
    for col, res in enumerate(results):
        f = [p["factor"] for p in res["points"]]
        latency = (("e2e_p95_s", "latency p95 (ms)") if res["system"] == "onnx"
                   else ("ttft_p95_s", "TTFT p95 (ms)"))
        for row, (key, label) in enumerate((latency, ("goodput", "goodput"))):
            ax = axes[row][col]
            scale = 1000 if key.endswith("_s") else 1
            for who, style in (("real", "o-"), ("sim", "s--"),
                               ("sim_closed_loop_profile", "^:"), ("sim_declared_cost", "x:"),
                               ("sim_calibration", "v:"), ("sim_profile", "v:"),
                               ("sim_own_steps", "d-.")):
                ys = [(p[who][key] or 0) * scale for p in res["points"] if who in p]
                if ys:
                    ax.plot(f[:len(ys)], ys, style, label=who.replace("_", " "))
            ax.set_xlabel("load (× measured capacity)")
            ax.set_ylabel(label)
            ax.set_title(f"{res['system']}: {label}")
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", default="synthetic,gemma")
    p.add_argument("--factors", default=",".join(map(str, FACTORS)),
                   type=lambda s: [float(x) for x in s.split(",")])
    p.add_argument("--duration", type=float, default=40.0, help="seconds of arrivals per point")
    p.add_argument("--calibration-s", type=float, default=20.0,
                   help="seconds of arrivals of the calibration run")
    p.add_argument("--rolling-min-steps", type=int, default=ROLLING_MIN_STEPS,
                   help="steps a bucket of the rolling table takes from the newest runs")
    p.add_argument("--rounds", type=int, default=4, help="closed-loop rounds for capacity")
    p.add_argument("--deadline-factor", type=float, default=4.0,
                   help="deadline = this × the median latency with every slot busy")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--variants-dir", type=Path, default=VARIANTS_DIR,
                   help="the onnx system's prepared and profiled variants")
    p.add_argument("--onnx-profile", type=Path,
                   help="onnx: a `sluice profile` result to serve and simulate with "
                   "(default: the one in --variants-dir)")
    p.add_argument("--capacity-s", type=float, default=8.0,
                   help="onnx: seconds of closed loop per concurrency for its capacity")
    p.add_argument("--out", default=str(RESULTS / "sim_validation.json"))
    p.add_argument("--write-costs", action="store_true",
                   help="also write examples/sim_cost_<system>.json from this run's "
                   "calibration (the run's JSON keeps it either way, under calibration)")
    p.add_argument("--keep-previous-as", metavar="LABEL",
                   help="keep each rerun system's previous result in earlier_runs as "
                   "<system>_<LABEL>")
    args = p.parse_args()
    out_path = Path(args.out)
    previous = json.loads(out_path.read_text()) if out_path.exists() else {}
    kept = {r["system"]: r for r in previous.get("systems", [])}
    earlier = dict(previous.get("earlier_runs", {}))
    for name in args.systems.split(","):
        if args.keep_previous_as and name in kept:
            earlier[f"{name}_{args.keep_previous_as}"] = kept[name]
        kept[name] = run_onnx(args) if name == "onnx" else run_system(name, args)
    results = [kept[n] for n in (*SYSTEMS, "onnx") if n in kept]
    doc = {"machine": {"python": platform.python_version(), "cores": os.cpu_count(),
                       "loadavg_at_end": os.getloadavg(),
                       "note": previous.get("machine", {}).get("note")},
           "tolerance": TOLERANCE, "seed": args.seed, "duration_s": args.duration,
           "systems": results, "earlier_runs": earlier}
    out_path.write_text(json.dumps(doc, indent=2) + "\n")
    plot(results, out_path.with_suffix(".png"))
    bad = [(r["system"], p["factor"]) for r in results for p in r["points"]
           if not p["within_tolerance"]]
    print(f"wrote {out_path}; outside tolerance: {bad or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
