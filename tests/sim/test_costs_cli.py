"""``sluice costs``: a cost file from a running server's recent steps (``/status.json``'s
tallies differenced over a window), and ``sluice simulate`` reading it."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from sluice.cli import costs as costs_cli
from sluice.cli import main
from sluice.cli.costs import live_costs
from sluice.sim.costs import read_costs, step_tables
from tests.server.live import SYNTHETIC_TOML, start_server, wait_for


def status(*models: dict[str, Any]) -> dict[str, Any]:
    return {"workers": [{"models": list(models)}]}


def chat(steps: dict[str, tuple[int, float]], learned: dict[str, float] | None = None
         ) -> dict[str, Any]:
    return {"model_id": "chat", "step_cost": learned,
            "step_times": {k: {"steps": n, "seconds": s, "prefill_tokens": 0}
                           for k, (n, s) in steps.items()}}


LINE = {"base_s": 0.01, "per_decode_token_s": 0.002, "per_prefill_token_s": 0.0001,
        "per_context_token_s": 0.0}


def test_the_window_is_the_difference_of_two_reads_over_the_base_entry() -> None:
    before = status(chat({"2": (10, 0.3), "1": (5, 0.05)}, LINE))
    after = status(chat({"2": (30, 0.9), "1": (5, 0.05), "4": (12, 0.6)}, LINE),
                   {"model_id": "embed", "step_cost": None, "step_times": {}})
    base = {"chat": {"step_cost": {**LINE, "base_s": 0.02}, "overhead_ms": 7.0},
            "embed": {"batch_ms": {"1": 3.0}}}
    costs = live_costs(before, after, base)
    assert costs["embed"] == {"batch_ms": {"1": 3.0}}  # untouched
    chat_cost = costs["chat"]
    assert chat_cost["overhead_ms"] == 7.0 and chat_cost["step_cost"]["base_s"] == 0.02
    assert set(chat_cost["step_times"]) == {"2", "4"}  # "1" ran no step in the window
    assert chat_cost["step_times"]["2"]["steps"] == 20
    assert step_tables(chat_cost)[0] == [(2, pytest.approx(0.03)), (4, pytest.approx(0.05))]
    # no base: the engine's learned line; no first read: every step since the load
    alone = live_costs(None, after)["chat"]
    assert alone["step_cost"] == LINE and alone["step_times"]["1"]["steps"] == 5


def test_sluice_costs_takes_the_window_from_a_live_server_and_simulate_reads_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps before the window are left out: the file counts exactly the decodes of the
    two requests sent during it (every token but a request's first is one decode)."""
    from sluice.config import load_config

    server = start_server(load_config(SYNTHETIC_TOML))
    out = tmp_path / "costs.json"
    try:
        with server.client() as http:
            def complete(max_tokens: int) -> None:
                r = http.post("/v1/completions", json={"model": "synth-chat", "prompt": "a b c",
                                                       "max_tokens": max_tokens})
                assert r.status_code == 200, r.text

            def decodes() -> int:
                tally = live_costs(None, http.get("/status.json").json())
                return sum(int(k.split("+")[0]) * b["steps"]
                           for k, b in tally.get("synth-chat", {}).get("step_times", {}).items())

            complete(20)
            wait_for(lambda: decodes() == 19)  # published after the loop that ran the step
            # the window opens at the CLI's first read: the next requests wait for it
            first_read = threading.Event()
            real_read_status = costs_cli.read_status

            def read_status(*args: Any) -> dict[str, Any]:
                status = real_read_status(*args)
                first_read.set()
                return status

            monkeypatch.setattr(costs_cli, "read_status", read_status)
            cli = threading.Thread(target=main, args=(
                ["costs", "--from", server.url, "--window-s", "3", "--out", str(out)],))
            cli.start()
            assert first_read.wait(10)
            complete(30)
            complete(30)
            wait_for(lambda: decodes() == 19 + 2 * 29)
            cli.join(10)
            assert not cli.is_alive()
    finally:
        server.stop()
    entry = read_costs(out)["synth-chat"]
    assert sum(int(k.split("+")[0]) * b["steps"] for k, b in entry["step_times"].items()) \
        == 2 * 29
    assert "step_cost" in entry  # the engine's learned line, no base given
    report = tmp_path / "r.json"
    assert main(["simulate", "-c", str(SYNTHETIC_TOML), "--costs", str(out), "-w",
                 "poisson:rate=8,duration=10,model=synth-chat,output=16", "--out",
                 str(report)]) == 0
    done = json.loads(report.read_text())["models"]["synth-chat"]
    assert done["states"]["completed"] == done["offered"] > 50


def test_a_server_that_is_not_there_is_an_error(tmp_path: Path) -> None:
    from tests.procs import free_port

    with pytest.raises(httpx.HTTPError):
        main(["costs", "--from", f"http://127.0.0.1:{free_port()}", "--window-s", "0"])


def test_a_live_planners_estimate_is_the_cost_of_a_machine_faster_than_its_profile(
        tmp_path: Path) -> None:
    """A variant profiled at 120 ms that runs in about 60 (the synthetic model's own
    time): the server's planner learns a drift near 0.5; ``sluice costs`` carries it,
    and the simulator charges batches what that planner predicts (the profile × the
    drift: faster than the profile, which ``overhead_ms`` could never say), its simulated
    planner starting from the same estimate."""
    from sluice.sim import SimConfig, generate, parse_spec, simulate
    from sluice.sim.costs import model_cost
    from sluice.sim.replica import make_tracker
    from tests.server.live import config_with

    options = {"accuracy": 0.9, "batch_fixed_s": 0.06, "per_item_s": 0.0005, "load_s": 0.0,
               "dim": 8, "labels": ["a", "b"], "service_ms": {"1": 120.0, "8": 130.0}}
    config = config_with(
        models=[{"id": "slow", "kind": "oneshot", "backend": "synthetic",
                 "task": "classification", "memory_bytes": 10_000_000, "load_cost_s": 0.1,
                 "options": options}],
        groups=[{"id": "g", "variants": ["slow"]}], workers={"count": 1, "budget_bytes": 10**9})
    server = start_server(config)
    try:
        with server.client() as http:
            for _ in range(30):
                assert http.post("/v1/infer", json={"model": "g", "input": "a b"}
                                 ).status_code == 200
            costs = live_costs(None, http.get("/status.json").json())
    finally:
        server.stop()
    estimate = costs["slow"]["estimate"]
    assert estimate["drift_samples"] == 30 and 0.45 < estimate["drift"] < 0.6
    cost = model_cost("slow", "oneshot", "synthetic", options, 0.0, costs)
    assert cost.batch_s(1) == pytest.approx(0.120 * estimate["drift"])
    assert model_cost("slow", "oneshot", "synthetic", options, 0.0).batch_s(1) == \
        pytest.approx(0.120)  # without it: the profile
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(costs))
    sim = SimConfig.from_config(config, read_costs(path))
    tracker = make_tracker(sim)
    assert tracker is not None
    assert tracker.service["slow"].batch_s(1) == pytest.approx(cost.batch_s(1))
    report, _ = simulate(sim, generate(parse_spec("poisson:rate=5,requests=50,model=g"), 1))
    assert report["overall"]["states"] == {"completed": 50}
