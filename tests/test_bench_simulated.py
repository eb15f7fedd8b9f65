"""bench/lib/simulated: the simulator's prediction of a closed-loop point from the
server's config and a cost file, and the measured figures beside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.lib.model_tables import SYNTH_CHAT, llm_table, server_tables, synthetic_chat_table
from bench.lib.simulated import (
    beside,
    err_cell,
    point_costs,
    predict_closed_loop,
    seen_before,
    serving_only,
)
from sluice.config import Config, load_config
from sluice.sim import Arrival


def config(tmp_path: Path) -> Config:
    """The synthetic chat model (20 ms a step, 8 slots) and a GGUF model with no cost
    anywhere: a second model the benchmark does not serve."""
    path = tmp_path / "sluice.toml"
    path.write_text(server_tables(SYNTH_CHAT, 64, 8) + synthetic_chat_table()
                    + llm_table("other", "/nowhere.gguf"))
    return load_config(path)


def requests(n: int) -> list[Arrival]:
    return [Arrival(0.0, SYNTH_CHAT, prompt_tokens=10, output_tokens=16)] * n


def test_a_closed_loop_prediction_serves_the_benchmarked_model_alone(tmp_path: Path) -> None:
    """The other model has no cost: left out, the prediction runs. One client reads one
    stream; four clients share each 20 ms step four ways, about four times the tokens."""
    cfg = config(tmp_path)
    assert [m.id for m in serving_only(cfg, SYNTH_CHAT).models] == [SYNTH_CHAT]
    with pytest.raises(ValueError, match="no model"):
        serving_only(cfg, "missing")
    one = predict_closed_loop(cfg, {}, SYNTH_CHAT, requests(8), 1)
    four = predict_closed_loop(cfg, {}, SYNTH_CHAT, requests(8), 4)
    assert one["states"] == four["states"] == {"completed": 8}
    assert one["tokens"] == 8 * 16
    assert one["tpot_p95_s"] == pytest.approx(0.02, rel=0.1)
    assert four["tokens_per_s"] == pytest.approx(4 * one["tokens_per_s"], rel=0.15)
    assert "goodput_requests" not in one


def test_requests_within_both_targets_count_as_the_load_generator_counts(
        tmp_path: Path) -> None:
    cfg = config(tmp_path)
    loose = predict_closed_loop(cfg, {}, SYNTH_CHAT, requests(6), 2, ttft_slo_s=2.0,
                                tpot_slo_s=0.15)
    tight = predict_closed_loop(cfg, {}, SYNTH_CHAT, requests(6), 2, ttft_slo_s=2.0,
                                tpot_slo_s=0.005)
    assert loose["goodput_requests"] == 6 and tight["goodput_requests"] == 0


def status(steps: int, seconds: float, drafted: int = 0) -> dict[str, object]:
    return {"workers": [{"models": [{
        "model_id": "m", "step_cost": {"base_s": 0.01, "per_decode_token_s": 0.001,
                                       "per_prefill_token_s": 0.0001},
        "step_times": {"2": {"steps": steps, "seconds": seconds, "prefill_tokens": 0}},
        "speculation": {"draft_tokens": drafted}}]}]}


def test_a_points_cost_file_is_its_window_of_steps_with_its_overhead_and_acceptance() -> None:
    costs = point_costs(status(10, 0.2), status(40, 0.8), "m", overhead_s=0.0125,
                        acceptance=0.61234)
    entry = costs["m"]
    assert entry["step_times"]["2"]["steps"] == 30
    assert entry["step_times"]["2"]["seconds"] == pytest.approx(0.6)
    assert entry["step_cost"]["base_s"] == 0.01
    assert entry["overhead_ms"] == 12.5 and entry["draft_acceptance"] == 0.6123
    plain = point_costs(status(10, 0.2), status(40, 0.8), "m", overhead_s=None)["m"]
    assert "overhead_ms" not in plain and "draft_acceptance" not in plain
    with pytest.raises(RuntimeError, match="no step-time model"):
        point_costs(status(10, 0.2), status(40, 0.8), "other", overhead_s=None)


def test_beside_gives_each_figure_measured_predicted_and_the_relative_error() -> None:
    c = beside({"tokens_per_s": 100.0, "ttft_p95_s": 0.5, "tpot_p95_s": None},
               {"tokens_per_s": 90.0, "ttft_p95_s": 0.6, "tpot_p95_s": 0.05})
    assert c["tokens_per_s"] == {"measured": 100.0, "predicted": 90.0, "rel_err": -0.1}
    assert c["ttft_p95_s"]["rel_err"] == pytest.approx(0.2)
    assert c["tpot_p95_s"]["rel_err"] is None
    assert err_cell(c, "tokens_per_s") == "90.0 (-10%)"
    assert err_cell(c, "ttft_p95_s", 1000, 0) == "600 (+20%)"
    assert err_cell({}, "tokens_per_s") == "-"


def test_seen_before_is_one_short_request_per_distinct_prompt() -> None:
    asks = [Arrival(0.0, "m", prompt_tokens=10 + i % 3, output_tokens=50, prefix_id=i % 3,
                    prefix_tokens=10 + i % 3) for i in range(7)]
    asks.append(Arrival(0.0, "m", prompt_tokens=5, output_tokens=5))  # no prefix: unseen
    warm = seen_before(asks)
    assert [(a.prefix_id, a.prompt_tokens, a.output_tokens) for a in warm] == [
        (0, 10, 1), (1, 11, 1), (2, 12, 1)]
