"""The simulator beside a benchmark's measured points: what it needs from a real run and
how its prediction is set beside the measurement.

From the run: prompt token counts (the server's ``/tokenize``), the time a request spent
outside the runtime (``access_lines`` and ``front_end_summary``: the client's TTFT less
the server's, from its JSON access log; requests tagged ``x-request-id: <tag>-<index>``)
and a cost file (``point_costs``: what ``sluice costs`` writes for a window of the
server's steps). Then ``predict_closed_loop`` runs the server's own config through
``sluice.sim.simulate_closed_loop`` with that cost file, and ``beside`` sets each
predicted figure next to the measured one with the simulator's relative error.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import httpx
import numpy as np

from bench.lib.loadgen import percentile
from sluice.cli.costs import live_costs
from sluice.config import Config
from sluice.sim import Arrival, SimConfig, simulate_closed_loop

PREDICTED = ("tokens_per_s", "ttft_p95_s", "tpot_p95_s")
"""The figures of a closed-loop point the simulator predicts beside the measured ones."""


class Timed(Protocol):
    """A request's outcome as a client saw it (``loadgen.Sample`` and the like)."""

    @property
    def ok(self) -> bool: ...

    @property
    def ttft_s(self) -> float | None: ...


def pct(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) of ``values``, or ``None`` for none."""
    return float(np.percentile(values, q)) if values else None


def p95(values: list[float]) -> float | None:
    return pct(values, 95)


def rel_err(sim: float | None, real: float | None) -> float | None:
    """``(sim - real) / real``, or ``None`` when either is missing or ``real`` is 0."""
    if sim is None or real is None or real == 0:
        return None
    return (sim - real) / real


async def token_counts(base: str, model: str, prompts: Sequence[str]) -> list[int]:
    """Each prompt's token count as the server's tokenizer gives it (special tokens
    added)."""
    async with httpx.AsyncClient() as client:
        out = []
        for p in prompts:
            r = await client.post(f"{base}/tokenize", json={"model": model, "content": p,
                                                             "add_special": True})
            r.raise_for_status()
            out.append(len(r.json()["tokens"]))
        return out


def access_lines(log: Path, tag: str) -> dict[int, dict[str, Any]]:
    """The server's JSON access lines of the requests tagged ``tag`` (by index)."""
    out: dict[int, dict[str, Any]] = {}
    prefix = f"{tag}-"
    for line in log.read_text(errors="replace").splitlines():
        if not line.startswith("{") or '"sluice.access"' not in line:
            continue
        rec = json.loads(line)
        rid = str(rec.get("request_id", ""))
        if rid.startswith(prefix) and rid[len(prefix):].isdigit():
            out[int(rid[len(prefix):])] = rec
    return out


def front_end_summary(samples: Sequence[Timed], lines: Mapping[int, Mapping[str, Any]],
                      lags: Sequence[float] = ()) -> dict[str, Any]:
    """Where a completed request's TTFT went, client vs server (``samples[k]`` is the
    request tagged ``k``): ``front_s`` = the client's TTFT less the server's (arrival in
    the runtime to first token): HTTP in, parsing, tokenizing, and streaming the first
    token back; ``queue_wait_s`` = the runtime's queued → started; ``send_lag_s``: what
    the load generator's sends lagged their schedule (``lags``, open loop)."""
    front, waits, server_ttft = [], [], []
    for k, s in enumerate(samples):
        rec = lines.get(k)
        if rec is None or not s.ok or s.ttft_s is None or rec.get("ttft_ms") is None:
            continue
        server_ttft.append(rec["ttft_ms"] / 1000.0)
        front.append(s.ttft_s - rec["ttft_ms"] / 1000.0)
        if rec.get("queue_wait_ms") is not None:
            waits.append(rec["queue_wait_ms"] / 1000.0)

    def q(xs: list[float]) -> dict[str, float | None]:
        return {"p50": pct(xs, 50), "p95": pct(xs, 95), "mean": statistics.fmean(xs)
                if xs else None}
    return {"matched": len(front), "front_s": q(front), "queue_wait_s": q(waits),
            "server_ttft_s": q(server_ttft), "send_lag_s": q(list(lags))}


def point_costs(before: Mapping[str, Any], after: Mapping[str, Any], model: str, *,
                overhead_s: float | None, acceptance: float | None = None
                ) -> dict[str, dict[str, Any]]:
    """The cost file of one measured point, as ``sluice costs`` writes it for the window
    between two ``/status.json`` reads (``before``, ``after``): the steps ``model``'s
    engine ran in between and the step-time line it had learned; with ``overhead_ms``
    (the mean front-end time measured at the point) and, where the engine drafted,
    ``draft_acceptance`` (its accepted / drafted tokens at the point)."""
    costs = live_costs(before, after)
    entry = costs.get(model)
    if entry is None or "step_cost" not in entry:
        raise RuntimeError(f"/status.json has no step-time model for {model!r}")
    if overhead_s is not None:
        entry["overhead_ms"] = round(overhead_s * 1000.0, 3)
    if acceptance is not None:
        entry["draft_acceptance"] = round(acceptance, 4)
    return {model: entry}


def serving_only(config: Config, model: str) -> Config:
    """``config`` with ``model`` its only model and the default: a benchmark's server
    serves one, and the simulator needs a cost for every model it is given."""
    data = config.model_dump()
    data["models"] = [m for m in data["models"] if m["id"] == model]
    if not data["models"]:
        raise ValueError(f"the config has no model {model!r}")
    data["server"]["default_model"] = model
    return Config.model_validate(data)


def predict_closed_loop(config: Config, costs: Mapping[str, Mapping[str, Any]], model: str,
                        requests: Sequence[Arrival], clients: int, *,
                        ttft_slo_s: float | None = None, tpot_slo_s: float | None = None,
                        warm: Sequence[Arrival] = ()) -> dict[str, Any]:
    """The simulator's prediction of a closed loop of ``clients`` sending ``requests`` (in
    order) to a server of ``config`` serving ``model``, loaded before the first request,
    with ``costs``: tokens/s, TTFT and TPOT p50/p95 of the completed requests (the same
    percentile as the load generator's) and, with both targets, the requests within them
    (``goodput_requests``, as ``loadgen.summarize`` counts them). ``warm``: what the
    server served before the loop (``seen_before``), run first and not counted."""
    sim = replace(SimConfig.from_config(serving_only(config, model), costs), preload=(model,))
    report, fleet = simulate_closed_loop(sim, requests, clients=clients, keep_requests=True,
                                         warm=warm)
    done = [r for r in fleet.requests or () if r.status == "completed" and r.end_s is not None]
    ttft = [(r.first_token_s if r.first_token_s is not None else r.end_s or 0.0)
            - r.arrival_s for r in done]
    tpot = [((r.end_s or 0.0) - (r.first_token_s or 0.0)) / (r.generated - 1)
            for r in done if r.first_token_s is not None and r.generated > 1]
    out: dict[str, Any] = {
        "requests": report["requests"], "states": report["overall"]["states"],
        "tokens": report["tokens"], "tokens_per_s": report["tokens_per_s"],
        "ttft_p50_s": percentile(ttft, 0.5), "ttft_p95_s": percentile(ttft, 0.95),
        "tpot_p50_s": percentile(tpot, 0.5), "tpot_p95_s": percentile(tpot, 0.95)}
    if ttft_slo_s is not None and tpot_slo_s is not None:
        out["goodput_requests"] = sum(
            t <= ttft_slo_s and (r.generated <= 1 or r.first_token_s is None
                                 or ((r.end_s or 0.0) - r.first_token_s)
                                 / (r.generated - 1) <= tpot_slo_s)
            for r, t in zip(done, ttft, strict=True))
    return out


def seen_before(requests: Sequence[Arrival]) -> list[Arrival]:
    """One request of one output token per distinct prompt (``prefix_id``) of
    ``requests``, in first-seen order: what a server that ran earlier levels of the same
    prompts had served, so its retained and cached prefixes hold them."""
    seen: dict[int | None, Arrival] = {}
    for a in requests:
        if a.prefix_id is not None and a.prefix_id not in seen:
            seen[a.prefix_id] = replace(a, output_tokens=1)
    return list(seen.values())


def beside(measured: Mapping[str, Any], predicted: Mapping[str, Any],
           keys: Sequence[str] = PREDICTED) -> dict[str, dict[str, float | None]]:
    """Each of ``keys``: the measured figure, the predicted one and the simulator's
    relative error (``(predicted - measured) / measured``)."""
    out: dict[str, dict[str, float | None]] = {}
    for k in keys:
        m, p = measured.get(k), predicted.get(k)
        err = rel_err(p, m)
        out[k] = {"measured": m, "predicted": p,
                  "rel_err": None if err is None else round(err, 4)}
    return out


def err_cell(comparison: Mapping[str, Mapping[str, float | None]], key: str,
             scale: float = 1.0, digits: int = 1) -> str:
    """``predicted (±err %)`` for a table cell, ``-`` for none."""
    c = comparison.get(key) or {}
    p, e = c.get("predicted"), c.get("rel_err")
    if p is None:
        return "-"
    return f"{p * scale:.{digits}f} ({'-' if e is None else f'{e * 100:+.0f}%'})"
