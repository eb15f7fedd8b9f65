"""``sluice simulate`` end to end: config file in, report out (JSON, file, plot)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sluice.cli import main

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "synthetic.toml")


def test_simulate_prints_a_json_report_and_writes_files(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    rc = main(["simulate", "-c", EXAMPLE, "-w",
               "poisson:rate=80,duration=10,model=synth-chat|synth-a,tenant=x:1|y:1",
               "--replicas", "2", "--workers", "1", "--json", "--out", str(out),
               "--plot", str(png)])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert report["config"]["replicas"] == 2 and report["workers"] == 2
    assert set(report["models"]) == {"synth-chat", "synth-a"}
    assert set(report["tenants"]) == {"x", "y"}
    assert sum(report["overall"]["states"].values()) == report["requests"] > 600
    assert json.loads(out.read_text())["requests"] == report["requests"]
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_simulate_replays_a_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(
        json.dumps({"t": i * 0.01, "model": "synth-b", "deadline_ms": 500}) + "\n"
        for i in range(50)))
    assert main(["simulate", "-c", EXAMPLE, "--trace", str(trace), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["requests"] == 50 and report["overall"]["states"] == {"completed": 50}


def test_simulate_needs_exactly_one_workload() -> None:
    with pytest.raises(ValueError, match="one of --workload"):
        main(["simulate", "-c", EXAMPLE])


def test_simulate_closed_loop_clients(capsys: pytest.CaptureFixture[str]) -> None:
    """``--clients``: the workload's requests through closed-loop clients; the report
    says how many and the tokens per second they read."""
    assert main(["simulate", "-c", EXAMPLE, "-w",
                 "poisson:rate=1,requests=24,model=synth-chat,prompt=10,output=16",
                 "--clients", "4", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["config"]["clients"] == report["clients"] == 4
    assert report["requests"] == 24 and report["overall"]["states"] == {"completed": 24}
    assert report["tokens"] == 24 * 16 and report["tokens_per_s"] > 0
    # 24 requests at 1/s would arrive over 24 s; the clients send them back to back
    assert report["arrival_span_s"] < 5
