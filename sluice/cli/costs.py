"""``sluice costs``: a simulator cost file from a running server's recent steps.

A shared machine's step speed moves by 10-20 % between runs minutes apart, and near
saturation a few per cent of service rate decide whether a queue forms; a cost file
measured last week (or last hour) predicts the next minutes worse than what the engine
ran just now. So, as an operator would before asking "what if":

    sluice costs --from http://127.0.0.1:8000 --window-s 60 \\
        --base examples/sim_cost_gemma.json --out now.json
    sluice simulate -c sluice.toml --costs now.json -w poisson:rate=4,...

reads ``/status.json`` twice, ``--window-s`` apart, and writes per generative model the
steps its engine ran in between (``step_times``: the tally's difference,
``sluice.engine.step_times.minus``) over the ``--base`` file's entry (its ``step_cost``,
``overhead_ms``, ``cv`` kept; without one, the engine's learned ``step_cost``), and per
variant of a model group what its planner's service estimator learned by the second
read (``estimate``: the drift from the profile in either direction, and the length
fit), over the profile the base or the config gives. With ``--window-s 0``, one read:
every step since the model loaded.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from sluice.engine.step_times import StepBucket, from_json, minus, plus, to_json


def worker_models(status: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """Every model entry on ``/status.json``, worker by worker (a model resident on two
    workers comes twice; a generative one carries its engine's ``step_cost`` and
    ``step_times``)."""
    for worker in status.get("workers", ()):
        yield from worker.get("models", ())


def model_tallies(status: Mapping[str, Any]) -> dict[str, dict[str, StepBucket]]:
    """Per generative model on ``/status.json``, its engines' step tallies (summed over
    the workers it is resident on)."""
    out: dict[str, dict[str, StepBucket]] = {}
    for m in worker_models(status):
        if m.get("step_times"):
            out[m["model_id"]] = plus(out.get(m["model_id"], {}), from_json(m["step_times"]))
    return out


def learned_step_costs(status: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per generative model, the step-time line its engine learned (the first worker's)."""
    out: dict[str, dict[str, Any]] = {}
    for m in worker_models(status):
        if m.get("step_cost"):
            out.setdefault(m["model_id"], dict(m["step_cost"]))
    return out


def live_costs(before: Mapping[str, Any] | None, after: Mapping[str, Any],
               base: Mapping[str, Mapping[str, Any]] | None = None
               ) -> dict[str, dict[str, Any]]:
    """A cost file (``sluice.sim.costs``) from two ``/status.json`` reads: the ``base``
    file's entries, each generative model that stepped in between given those steps
    (``before`` None: every step since it loaded) and, where the base has none, the
    engine's learned step cost; each variant of a group its planner's service estimate
    as of the second read (``estimate``: what the estimator learned of this machine's
    speed from its recent batches; the profile stays the base's or the model's). Models
    with no step in the window keep the base entry."""
    out = {k: dict(v) for k, v in (base or {}).items()}
    earlier = model_tallies(before) if before is not None else {}
    learned = learned_step_costs(after)
    for model_id, tally in model_tallies(after).items():
        window = minus(tally, earlier.get(model_id, {}))
        if not window:
            continue
        entry = out.setdefault(model_id, {})
        entry["step_times"] = to_json(window)
        if "step_cost" not in entry and model_id in learned:
            entry["step_cost"] = learned[model_id]
    for variant, state in after.get("variants", {}).items():
        if state.get("estimate"):
            out.setdefault(variant, {})["estimate"] = dict(state["estimate"])
    return out


def read_status(url: str, metrics_key: str | None = None) -> dict[str, Any]:
    import httpx

    headers = {"X-Metrics-Key": metrics_key} if metrics_key else None
    r = httpx.get(f"{url.rstrip('/')}/status.json", headers=headers, timeout=30.0)
    r.raise_for_status()
    status: dict[str, Any] = r.json()
    return status


def cmd_costs(args: argparse.Namespace) -> int:
    from sluice.sim.costs import read_costs

    base = read_costs(Path(args.base)) if args.base else None
    before = read_status(args.url, args.metrics_key) if args.window_s > 0 else None
    if before is not None:
        time.sleep(args.window_s)
    costs = live_costs(before, read_status(args.url, args.metrics_key), base)
    text = json.dumps(costs, indent=2) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text, end="")
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("costs", help="a simulator cost file from a running server's steps",
                       description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--from", dest="url", required=True,
                   help="the server's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--window-s", type=float, default=60.0,
                   help="seconds of steps to take (0: every step since the model loaded)")
    p.add_argument("--base", help="a cost file whose entries the live steps go over")
    p.add_argument("--metrics-key", help="the server's metrics key, when it sets one")
    p.add_argument("--out", help="write the cost file here (default: print it)")
    p.add_argument("--log-level", default="warning")
    p.set_defaults(func=cmd_costs)
