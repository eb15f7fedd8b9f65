"""Workload specs and processes, traces, and cost models."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from sluice.policy.step.step_cost import StepCost
from sluice.sim.costs import ModelCost, model_cost, read_costs
from sluice.sim.workload import generate, parse_spec, read_trace, write_trace


def test_spec_parses_mixes_and_names_bad_keys() -> None:
    spec = parse_spec("poisson:rate=20,duration=5,model=a:3|b:1,tenant=x,deadline_ms=250")
    assert spec.models == (("a", 3.0), ("b", 1.0)) and spec.deadline_s == 0.25
    with pytest.raises(ValueError, match="colour"):
        parse_spec("poisson:rate=1,duration=1,colour=red")
    with pytest.raises(ValueError, match="must end"):
        parse_spec("poisson:rate=1")
    with pytest.raises(ValueError, match="process"):
        parse_spec("uniform:rate=1,duration=1")


@pytest.mark.parametrize("text", [
    "poisson:rate=50,duration=400",
    "onoff:rate=150,off_rate=10,on_s=2,off_s=6,duration=4000",
    "diurnal:rate=80,trough=0.25,period_s=50,duration=400",
])
def test_processes_run_at_their_mean_rate(text: str) -> None:
    spec = parse_spec(text)
    times = [a.time_s for a in generate(spec, seed=3)]
    assert times == sorted(times)
    assert len(times) / spec.duration_s == pytest.approx(spec.mean_rate_per_s, rel=0.08)


def test_onoff_is_burstier_than_poisson() -> None:
    def dispersion(text: str) -> float:
        counts = [0] * 400
        for a in generate(parse_spec(text), seed=1):
            counts[min(int(a.time_s), 399)] += 1
        mean = sum(counts) / len(counts)
        return sum((c - mean) ** 2 for c in counts) / len(counts) / mean
    assert dispersion("poisson:rate=40,duration=400") == pytest.approx(1.0, abs=0.3)
    assert dispersion("onoff:rate=80,off_rate=0,on_s=5,off_s=5,duration=400") > 5


def test_requests_bound_and_mix_weights() -> None:
    arrivals = list(generate(parse_spec("poisson:rate=100,requests=4000,model=a:3|b:1"), 0))
    assert len(arrivals) == 4000
    share = sum(a.model == "a" for a in arrivals) / 4000
    assert share == pytest.approx(0.75, abs=0.03)


def test_trace_round_trip(tmp_path: Path) -> None:
    spec = parse_spec("poisson:rate=10,duration=5,model=m,deadline_ms=100,prefixes=2,"
                      "prefix_tokens=4")
    arrivals = list(generate(spec, 1))
    buf = io.StringIO()
    write_trace(arrivals, buf)
    path = tmp_path / "t.jsonl"
    path.write_text(buf.getvalue())
    back = list(read_trace(path))
    assert [(a.model, a.deadline_s, a.prefix_id) for a in back] == \
        [(a.model, a.deadline_s, a.prefix_id) for a in arrivals]
    assert [a.time_s for a in back] == pytest.approx([a.time_s for a in arrivals], abs=1e-6)
    path.write_text('{"t": 2, "model": "m"}\n{"t": 1, "model": "m"}\n')
    with pytest.raises(ValueError, match=":2: arrivals must be in time order"):
        list(read_trace(path))


def test_batch_times_interpolate_and_extrapolate() -> None:
    cost = ModelCost.oneshot({"1": 10.0, "4": 16.0, "8": 20.0}, load_s=0.0)
    assert cost.batch_s(1) == pytest.approx(0.010)
    assert cost.batch_s(2) == pytest.approx(0.012)
    assert cost.batch_s(6) == pytest.approx(0.018)
    assert cost.batch_s(12) == pytest.approx(0.024)


def test_cost_sources_in_order(tmp_path: Path) -> None:
    step = tmp_path / "step.json"
    StepCost(0.01, 0.002, 0.0001).save(step)
    files = {"llm": {"step_cost": "step.json", "load_s": 2.5}}
    got = model_cost("llm", "generative", "llamacpp", {}, 1.0, files, tmp_path)
    assert got.step == StepCost(0.01, 0.002, 0.0001) and got.load_s == 2.5
    synthetic = model_cost("s", "oneshot", "synthetic",
                           {"batch_fixed_s": 0.004, "per_item_s": 0.001, "speed_scale": 2}, 0.0)
    assert synthetic.batch_s(3) == pytest.approx(2 * (0.004 + 3 * 0.001))
    with pytest.raises(ValueError, match="no cost model"):
        model_cost("llm", "generative", "llamacpp", {}, 1.0)
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"variants": {"int8": {"model": "cls-int8",
                                                          "batch_ms": {"1": 3.0, "8": 9.0}}}}))
    assert read_costs(profile) == {"cls-int8": {"batch_ms": {"1": 3.0, "8": 9.0}}}


def test_input_lengths_come_from_their_own_stream() -> None:
    """``input_chars`` draws lengths without changing the arrivals a seed gives; a trace
    keeps them."""
    plain = list(generate(parse_spec("poisson:rate=50,requests=500,model=m"), 3))
    sized = list(generate(parse_spec("poisson:rate=50,requests=500,model=m,"
                                     "input_chars=20-300"), 3))
    assert [a.time_s for a in sized] == [a.time_s for a in plain]
    assert all(a.input_chars == 0 for a in plain)
    lengths = [a.input_chars for a in sized]
    assert min(lengths) >= 20 and max(lengths) <= 300 and len(set(lengths)) > 100
    assert lengths == [a.input_chars for a in generate(parse_spec(
        "poisson:rate=50,requests=500,model=m,input_chars=20-300"), 3)]
    fixed = list(generate(parse_spec("poisson:rate=5,requests=3,model=m,input_chars=80"), 0))
    assert [a.input_chars for a in fixed] == [80, 80, 80]
    buf = io.StringIO()
    write_trace(sized[:5], buf)
    assert [json.loads(line)["input_chars"] for line in buf.getvalue().splitlines()] == \
        lengths[:5]
    for bad in ("input_chars=300-20", "input_chars=x"):
        with pytest.raises(ValueError, match="input_chars"):
            parse_spec(f"poisson:rate=1,requests=1,{bad}")


def test_a_batch_takes_longer_with_a_longer_longest_input() -> None:
    """With the profile's length fit, a batch's time is what the planner's service model
    predicts from it before it has seen a batch: its size's curve × the length factor of
    its longest input over the typical longest at that size (between sizes
    interpolated); 0 characters (unknown) is the curve. The older fit in characters is
    read too."""
    from sluice.policy.variants.service_estimator import LengthPrior, ServiceEstimator

    fit = {"slope": 0.5, "mean": 1.0, "var": 0.2, "typical_longest_chars": {"1": 100.0,
                                                                            "8": 240.0}}
    entry = {"batch_ms": {"1": 40.0, "8": 200.0}, "length_prior": fit}
    cost = model_cost("m", "oneshot", "onnx", {}, 0.0, {"m": entry})
    assert cost.batch_s(1) == pytest.approx(0.040)
    assert cost.batch_s(1, 100) == pytest.approx(0.040)
    assert cost.batch_s(1, 300) == pytest.approx(0.040 * 2.0)
    assert cost.batch_s(8, 240) == pytest.approx(0.200)
    assert cost.batch_s(8, 120) == pytest.approx(0.200 * 0.75)
    planner = ServiceEstimator({1: 0.040, 8: 0.200}, length_prior=LengthPrior.from_json(fit))
    for n, chars in ((1, 37), (3, 180), (8, 400), (12, 500)):
        assert cost.batch_s(n, chars) == pytest.approx(planner.batch_s(n, chars))
    old = {"slope_per_char": 0.005, "mean_chars": 150.0, "var_chars": 4000.0}
    in_chars = model_cost("m", "oneshot", "onnx", {}, 0.0,
                          {"m": {"batch_ms": {"1": 40.0}, "length_prior": old}})
    assert in_chars.batch_s(1, 250) == pytest.approx(0.040 * 1.5)
    # a profile result's fit is read with its batch times; a model's options also carry it
    assert read_costs_of({"variants": {"fp32": {"model": "cls-fp32", **entry,
                                                "length": fit}}}) == \
        {"cls-fp32": {"batch_ms": entry["batch_ms"], "length_prior": fit}}
    from_options = model_cost("m", "oneshot", "onnx", {"service_ms": entry["batch_ms"],
                                                       "length_prior": fit}, 0.0)
    assert from_options.batch_s(1, 300) == pytest.approx(0.080)


def read_costs_of(profile: dict[str, object]) -> dict[str, dict[str, object]]:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "profile.json"
        path.write_text(json.dumps(profile))
        return read_costs(path)
