"""The report arithmetic of the benchmark scripts (they measure on a quiet machine; what
they compute from the measurements is checked here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.frontier import frontier
from bench.goodput_sweep import misses, plan_shares, ratios, report, summarize


def row(policy: str, goodput: float, cpu_ms: float | None, acc: float | None,
        share: float | None = None) -> dict[str, Any]:
    return {"rho": 0.95, "policy": policy, "goodput_mean": goodput, "cpu_ms_per_good": cpu_ms,
            "served_accuracy": acc, "mix_accuracy": acc, "share_on_best": share}


def test_ratios_divide_adaptive_by_each_accurate_baseline() -> None:
    table = [row("accurate", 2.0, 400.0, 0.89), row("accurate_expiry", 5.0, 200.0, 0.88),
             row("fastest", 12.0, 20.0, 0.76), row("adaptive", 10.0, 50.0, 0.87, 0.1)]
    points = [{"rho": 0.95, "policy": p, "repeat": rep, "good": g}
              for p, goods in (("accurate", (2, 4)), ("accurate_expiry", (5, 5)),
                               ("adaptive", (10, 10))) for rep, g in enumerate(goods)]
    [r] = ratios(table, points)
    assert r["goodput_vs_accurate"] == pytest.approx(5.0)
    assert r["goodput_vs_accurate_range"] == [2.5, 5.0]  # paired per repeat
    assert r["goodput_vs_accurate_expiry_range"] == [2.0, 2.0]
    assert r["goodput_vs_accurate_expiry"] == pytest.approx(2.0)
    assert r["cost_vs_accurate"] == pytest.approx(0.125)
    assert r["accuracy_points_vs_accurate"] == pytest.approx(2.0)
    assert r["adaptive_share_on_best"] == 0.1


def test_ratios_against_fastest_are_per_arrival_process() -> None:
    table = [row("fastest", 12.0, 20.0, 0.76) | {"process": "onoff"},
             row("adaptive", 11.94, 50.0, 0.86) | {"process": "onoff"},
             row("adaptive", 10.0, 50.0, 0.87)]  # Poisson, no fastest row
    points = [{"rho": 0.95, "policy": p, "repeat": 0, "good": g, "process": "onoff"}
              for p, g in (("fastest", 100), ("adaptive", 99))]
    poisson, onoff = ratios(table, points)
    assert (poisson["process"], onoff["process"]) == ("poisson", "onoff")
    assert "goodput_vs_fastest" not in poisson
    assert onoff["goodput_vs_fastest"] == pytest.approx(0.995)
    assert onoff["goodput_vs_fastest_range"] == [0.99, 0.99]
    assert onoff["accuracy_points_vs_fastest"] == pytest.approx(-10.0)  # 10 points above


def test_a_baseline_with_no_good_answers_has_no_ratio() -> None:
    table = [row("accurate", 0.0, None, None), row("accurate_expiry", 1.0, 300.0, 0.9),
             row("fastest", 12.0, 20.0, 0.76), row("adaptive", 10.0, 50.0, 0.87)]
    [r] = ratios(table, [])
    assert r["goodput_vs_accurate"] is None
    assert r["goodput_vs_accurate_range"] is None
    assert r["cost_vs_accurate"] is None
    assert r["accuracy_points_vs_accurate"] is None


def test_goodput_counts_only_answers_within_the_deadline() -> None:
    samples = [
        {"status": 200, "latency_s": 0.10, "variant": "a", "correct": True},
        {"status": 200, "latency_s": 0.35, "variant": "a", "correct": False},  # late
        {"status": 200, "latency_s": 0.20, "variant": "b", "correct": False},
        {"status": 503, "latency_s": 0.01, "code": "deadline_infeasible"},
        {"status": 0, "latency_s": 1.0, "error": "ConnectError"},
    ]
    for i, sample in enumerate(samples):
        sample["at_s"] = 0.1 * i
    s = summarize(samples, duration_s=2.0, deadline_ms=300.0, cpu_s=1.0)
    assert (s["sent"], s["ok"], s["good"]) == (5, 3, 2)
    assert s["goodput_per_s"] == pytest.approx(1.0)
    assert s["served_accuracy"] == pytest.approx(1 / 3)
    assert s["good_accuracy"] == pytest.approx(0.5)
    assert s["variant_mix"] == {"a": 2, "b": 1}
    assert s["failures"] == {"503:deadline_infeasible": 1, "0:ConnectError": 1}
    assert s["cpu_s_per_good"] == pytest.approx(0.5)
    assert [m["at_s"] for m in s["misses"]] == pytest.approx([0.1, 0.3, 0.4])


def test_misses_keep_what_the_server_reported_in_arrival_order() -> None:
    samples = [
        {"at_s": 0.9, "chars": 40, "status": 200, "latency_s": 0.05, "variant": "a"},
        {"at_s": 1.0, "chars": 300, "status": 504, "latency_s": 0.16, "code": "deadline",
         "variant": "a", "plan_reason": "low_load", "pool_idle": True, "batch_size": 1.0,
         "predicted_sojourn_ms": 120.0, "sojourn_ms": 155.0, "run_ms": 150.0},
        {"at_s": 0.2, "chars": 10, "status": 200, "latency_s": 0.2, "variant": "b"},  # late
    ]
    late, expired = misses(samples, deadline_ms=150.0)
    assert (late["at_s"], late["latency_ms"], late["arrivals_before"]) == (0.2, 200.0, 1)
    assert "predicted_sojourn_ms" not in late  # not reported: not invented
    assert expired["arrivals_before"] == 2  # 0.9 and itself, within 0.5 s
    assert (expired["code"], expired["predicted_sojourn_ms"], expired["sojourn_ms"]) == \
        ("deadline", 120.0, 155.0)


def test_plan_shares_split_by_the_pool_the_request_found() -> None:
    def s(idle: bool, fits: bool, variant: str | None, reason: str) -> dict[str, Any]:
        return {"pool_idle": idle, "accurate_fits_alone": fits, "variant": variant,
                "plan_reason": reason}
    shares = plan_shares([s(True, True, "acc", "low_load"), s(True, True, "acc", "low_load"),
                          s(True, False, "mid", "backlog"), s(False, True, "mid", "backlog"),
                          s(False, True, "acc", "low_load"), {"status": 200}], best="acc")
    assert shares["idle_fits"] == {"n": 2, "on_best": 2}
    assert shares["idle_too_long"] == {"n": 1, "on_best": 0}
    assert shares["busy"] == {"n": 2, "on_best": 1}
    assert shares["reasons"] == {"low_load": 3, "backlog": 2}


def manifest_and_profile(ok: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
    manifest = {"data": {"n_train": 8, "n_test": 2}, "variants": {
        "big": {"accuracy": 0.9, "precision": "fp32", "family": "f", "bytes": 4e8},
        "small": {"accuracy": 0.8, "precision": "int8", "family": "f", "bytes": 1e8},
    }}
    timing = {"batch_ms": {"1": 10.0}, "p50_ms": {"1": 9.0}, "p95_ms": {"1": 12.0},
              "samples": {"1": 8}, "threads": 1}
    profile = {"variants": {"big": timing, "small": timing},
               "cross_check": {"big": {"ok": True}, "small": {"ok": ok}}}
    return manifest, profile


def test_frontier_joins_manifest_and_profile_most_accurate_first() -> None:
    result = frontier(*manifest_and_profile())
    assert list(result["variants"]) == ["big", "small"]
    assert result["variants"]["small"]["mb"] == 100.0
    assert result["variants"]["big"]["batch_ms"] == {"1": 10.0}


def test_frontier_refuses_a_failed_cross_check() -> None:
    with pytest.raises(ValueError, match="cross-check"):
        frontier(*manifest_and_profile(ok=False))


def point(policy: str, rep: int, goodput: float, mix: dict[str, int]) -> dict[str, Any]:
    good = int(goodput * 10)
    return {"repeat": rep, "rho": 0.4, "policy": policy, "goodput_per_s": goodput,
            "good": good, "sent": 50, "cpu_s": good * 0.05 * (1 + rep),
            "served_accuracy": 0.85, "p95_ms": 100.0,
            "variant_mix": {f"sentiment-{v}": n for v, n in mix.items()}}


def test_report_rebuilds_table_and_ratios_from_the_points() -> None:
    points = [point(p, rep, 4.0 + rep, {"big": 3, "small": 1} if p == "adaptive" else
                    {"big": 4})
              for p in ("accurate", "accurate_expiry", "fastest", "adaptive") for rep in (0, 1)]
    result = report({"variants": {"big": 0.9, "small": 0.8}, "points": points})
    ada = next(r for r in result["table"] if r["policy"] == "adaptive")
    assert (ada["goodput_min"], ada["goodput_mean"], ada["goodput_max"]) == (4.0, 4.5, 5.0)
    assert ada["mix"] == {"big": 6, "small": 2}
    assert ada["share_on_best"] == pytest.approx(0.75)
    assert ada["mix_accuracy"] == pytest.approx(0.875)
    assert ada["good_fraction"] == pytest.approx(0.9)  # (40 + 50) / 2 / 50
    assert ada["good_fraction_spread"] == pytest.approx(0.2 / 0.9)
    # CPU pooled over repeats: (40·0.05 + 50·0.1) / 90 s per good answer.
    assert ada["cpu_ms_per_good"] == pytest.approx(1000 * 7.0 / 90)
    [r] = result["ratios"]
    assert r["mix_accuracy_points_vs_accurate"] == pytest.approx(2.5)
    assert r["goodput_vs_accurate"] == pytest.approx(1.0)


def test_hpa_target_is_the_ttft_budget_over_the_wait_each_request_adds() -> None:
    from bench.capacity import hpa_target

    # 1 req/s when full: each waiting request adds 1 s (Little); 2 s objective, 0.3 s TTFT
    # with every slot busy → 1.7 s of budget → 1 waiting request per pod.
    assert hpa_target(1.0, 0.3, 0.8) == (1.0, pytest.approx(1.7), 1)
    # A measured wait above 1/mu is the one used.
    wait, _, target = hpa_target(4.0, 0.2, 0.5)
    assert wait == 0.5 and target == 3
    # Never below one, even when full already misses the objective.
    assert hpa_target(1.0, 2.5, 1.0)[2] == 1


def test_grpc_overhead_summary_pairs_the_protocols_per_client_count() -> None:
    from bench.grpc_overhead import summarize as overhead

    def r(protocol: str, clients: int, server: float, tpot: float) -> dict[str, Any]:
        return {"protocol": protocol, "clients": clients, "server_cpu_ms_per_token": server,
                "client_cpu_ms_per_token": server / 2, "tpot_ms": tpot, "tokens_per_s": 100.0}

    rows = [r("http", 1, 30.0, 20.0), r("http", 1, 32.0, 22.0), r("grpc", 1, 29.0, 20.0),
            r("grpc", 1, 29.0, 20.0), r("http", 8, 10.0, 60.0), r("grpc", 8, 9.0, 57.0)]
    s = overhead(rows)
    assert s["1"]["http"]["server_cpu_ms_per_token"] == 31.0
    assert s["1"]["server_cpu_us_per_token_saved_by_grpc"] == pytest.approx(2000.0)
    assert s["1"]["ratio_server_cpu_grpc_over_http"] == pytest.approx(29 / 31)
    assert s["8"]["ratio_tpot_grpc_over_http"] == pytest.approx(0.95)
    assert s["8"]["http"]["server_cpu_ms_per_token_stdev"] == 0.0


def arrival(at_s: float, ok: bool = True, variant: str = "sentiment-big") -> dict[str, Any]:
    return {"at_s": at_s, "status": 200, "latency_s": 0.05 if ok else 0.5, "variant": variant}


def test_step_recovery_is_the_end_of_the_last_window_below_target() -> None:
    from bench.goodput_step import recovery_s

    step = 2.0
    samples = [arrival(step + 0.01 * k) for k in range(300)]  # 3 s after the step
    assert recovery_s(samples, 150.0, step, 5.0) == 0.0
    samples[50] = arrival(step + 0.5, ok=False)  # one late answer, 0.5 s after the step
    # windows [w, w + 0.5) containing 2.5 start at 2.1 .. 2.5: the last ends at 3.0
    assert recovery_s(samples, 150.0, step, 5.0) == pytest.approx(1.0)


def test_step_mix_over_time_and_the_return_to_the_best_variant() -> None:
    from bench.goodput_step import back_on_best_s, mix_over_time

    samples = [arrival(0.1 * k, variant="sentiment-small" if k < 10 else "sentiment-big")
               for k in range(20)]
    mix = mix_over_time(samples, 2.0)
    assert mix["small"][:4] == [1.0, 1.0, 1.0, 1.0]
    assert mix["big"][4:] == [1.0, 1.0, 1.0, 1.0]
    # from 0: the first window of arrivals >= 90 % on big is [1.0, 1.5), ending 1.5 s in
    assert back_on_best_s(samples, "sentiment-big", 0.0, 2.0) == pytest.approx(1.5)
    assert back_on_best_s(samples, "sentiment-none", 0.0, 2.0) is None


def llm_row(system: str, clients: int, tokens_per_s: float, ttft_s: float,
            tpot_s: float) -> dict[str, Any]:
    return {"system": system, "kind": "closed", "label": f"c={clients}",
            "concurrency": clients, "tokens_per_s": tokens_per_s, "ttft_p50_s": ttft_s,
            "ttft_p95_s": ttft_s * 2, "tpot_p50_s": tpot_s, "goodput_per_s": 1.0}


def test_llm_headline_pairs_each_level_with_llama_server_and_divides() -> None:
    from bench.llm_bench import headline, headline_markdown

    rows = [llm_row("sluice-continuous", 1, 30.0, 0.1, 0.03),
            llm_row("llama-server", 1, 25.0, 0.2, 0.04),
            llm_row("sluice-continuous", 8, 120.0, 0.4, 0.06),
            llm_row("llama-server", 8, 100.0, 0.5, 0.08),
            llm_row("sluice-static", 8, 60.0, 0.9, 0.1),
            llm_row("sluice-continuous", 16, 130.0, 1.0, 0.1)]  # no peer row: left out
    table = headline(rows)
    assert [h["clients"] for h in table] == [1, 8]
    assert table[0]["tokens_per_s_ratio"] == pytest.approx(1.2)
    assert table[1]["tokens_per_s_ratio"] == pytest.approx(1.2)
    assert table[1]["ttft_p50_ratio"] == pytest.approx(0.8)
    assert table[1]["tpot_p50_ratio"] == pytest.approx(0.75)
    text = headline_markdown({"headline": table, "model_label": "Gemma 3 270M Q4_K_M",
                              "threads": 2, "slots": 8, "max_tokens": 128, "quick": True,
                              "started": "2026-12-02T11:00:00Z",
                              "machine": {"cpus": 2, "cpu": "Xeon"}})
    lines = text.splitlines()
    assert lines[0].startswith("| clients | sluice tok/s | llama-server tok/s | ratio")
    assert lines[3] == "| 8 | 120.0 | 100.0 | **1.20×** | 400 ms / 500 ms | 60 ms / 80 ms |"
    assert "Gemma 3 270M Q4_K_M" in text and "--quick" in text and "2026-12-02" in text


def test_sluice_bench_outside_a_checkout_says_where_to_run_it(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from sluice.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--quick"]) == 2
    assert "source checkout" in capsys.readouterr().err


def test_speculation_rows_count_usage_tokens_and_the_table_divides_auto_by_off() -> None:
    from bench.speculation import AUTO, NGRAM, OFF, Reply, row_of, sluice_toml, table

    off = row_of(OFF, "grounded", 1, [Reply(True, "a", 100, 0.1, 0.02),
                                      Reply(True, "b", 50, 0.1, 0.04), Reply(False)],
                 10.0, (0, 0))
    auto = row_of(AUTO, "grounded", 1, [Reply(True, "a", 100, 0.1, 0.01),
                                        Reply(True, "b", 50, 0.1, 0.01)], 5.0, (80, 60))
    ngram = row_of(NGRAM, "grounded", 1, [Reply(True, "a", 150, 0.1, 0.01)], 6.0, (40, 20),
                   "ngram-mod")
    assert (off["tokens"], off["errors"], off["tokens_per_s"]) == (150, 1, 15.0)
    assert off["tpot_p50_s"] == pytest.approx(0.03) and off["acceptance"] is None
    assert auto["tokens_per_s"] == 30.0 and auto["acceptance"] == 0.75
    assert ngram["spec_type"] == "ngram-mod" and ngram["tokens_per_s"] == 25.0
    text = table([off, auto, ngram])
    assert "**2.00×**" in text and "0.75" in text
    assert "25.0 (ngram-mod)" in text and "**1.20×**" in text
    assert 'speculation = "off"' in sluice_toml("off") and "ttft_target_ms" not in sluice_toml(
        "auto")


def test_speculation_goals_say_by_how_much_each_is_missed() -> None:
    """Grounded at 1 client: auto 1.5x off (short of 2x by 0.5) and 1.5x the n-gram peer
    (met); auto under 0.98x off at 4 clients of free chat is missed by its shortfall;
    greedy output identical on one workload, not the other."""
    from bench.speculation import AUTO, NGRAM, OFF, goals

    def row(system: str, workload: str, clients: int, tps: float) -> dict[str, Any]:
        return {"system": system, "workload": workload, "concurrency": clients,
                "tokens_per_s": tps, "spec_type": "ngram-simple" if system == NGRAM else None}

    rows = [row(OFF, "grounded", 1, 10.0), row(AUTO, "grounded", 1, 15.0),
            row(NGRAM, "grounded", 1, 10.0), row(OFF, "free", 4, 20.0),
            row(AUTO, "free", 4, 19.0)]
    identical = {"grounded": {"prompts": 12, "identical_to_sluice_off": {AUTO: 12}},
                 "free": {"prompts": 8, "identical_to_sluice_off": {AUTO: 7}}}
    g = goals(rows, identical)
    assert g["grounded_1_client_auto_vs_off"] == {"value": 1.5, "bound": 2.0, "met": False,
                                                  "missed_by": 0.5}
    peer = g["grounded_1_client_auto_vs_llama_server_best_ngram"]
    assert peer["met"] and peer["spec_type"] == "ngram-simple"
    assert g["grounded_1_clients_auto_vs_off"]["met"]
    assert g["free_4_clients_auto_vs_off"] == {"value": 0.95, "bound": 0.98, "met": False,
                                               "missed_by": 0.03}
    assert g["grounded_greedy_identical"]["met"]
    assert g["free_greedy_identical"] == {"value": 7, "bound": 8, "met": False, "missed_by": 1}


def test_speculation_reads_the_ngram_types_a_llama_server_build_accepts(tmp_path: Path
                                                                        ) -> None:
    from bench.speculation import spec_types

    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\necho '-t, --threads N   threads'\n"
                    "echo '--spec-type [none|ngram-cache|ngram-simple|ngram-map-k|"
                    "ngram-map-k4v|ngram-mod]  comma-separated list'\n")
    fake.chmod(0o755)
    assert spec_types(fake) == ["ngram-cache", "ngram-simple", "ngram-map-k", "ngram-map-k4v",
                                "ngram-mod"]
    fake.write_text("#!/bin/sh\necho '--threads N'\n")
    with pytest.raises(RuntimeError, match="no --spec-type"):
        spec_types(fake)


def test_overload_levels_are_selectable_and_goals_say_by_how_much_they_miss() -> None:
    import argparse

    from bench.llm_overload import LEVELS, PEER, SLUICE, comparison, goals, parse_levels

    assert LEVELS == (8, 16, 32, 48)
    assert parse_levels("8,16, 32,48") == (8, 16, 32, 48)
    for bad in ("8,x", "0,8", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="--clients"):
            parse_levels(bad)

    def row(system: str, clients: int, tps: float, ttft: float, tpot: float,
            good: int) -> dict[str, Any]:
        return {"system": system, "clients": clients, "tokens_per_s": tps,
                "ttft_p95_s": ttft, "tpot_p95_s": tpot, "goodput_requests": good,
                "requests": 64}

    rows = [row(SLUICE, 16, 100, 1, 0.1, 30), row(SLUICE, 32, 90, 3.2, 0.1, 40),
            row(PEER, 32, 100, 2.0, 0.12, 45)]
    table = comparison(rows, (16, 32))
    assert [c["clients"] for c in table] == [32]  # no llama-server row at 16
    g = goals(table)["32"]
    assert g["tokens_per_s_at_least_1x"] == {"value": 0.9, "bound": 1.0, "met": False,
                                             "missed_by": 0.1}
    assert g["ttft_p95_within_1_5x"]["missed_by"] == 0.1
    assert g["tpot_p95_within_1x"]["met"]
    assert g["more_within_both"] == {"value": 40, "bound": 46, "met": False, "missed_by": 6}
    # when llama-server has every request within both, all of them is the most there is
    rows[1:] = [row(SLUICE, 32, 90, 3.2, 0.1, 64), row(PEER, 32, 100, 2.0, 0.12, 64)]
    assert goals(comparison(rows, (32,)))["32"]["more_within_both"] == {
        "value": 64, "bound": 64, "met": True, "missed_by": None}
    rows[1] = row(SLUICE, 32, 90, 3.2, 0.1, 63)
    assert goals(comparison(rows, (32,)))["32"]["more_within_both"]["missed_by"] == 1


def test_ab_sides_parse_ref_and_worker_lines_and_the_summary_divides_medians() -> None:
    import argparse

    from bench.ab import parse_side, summary

    side = parse_side('process=.+isolation="process"')
    assert (side.label, side.ref, side.workers_extra) == ("process", ".", ('isolation="process"',))
    assert parse_side("before=59601b8~1").workers_extra == ()
    with pytest.raises(argparse.ArgumentTypeError):
        parse_side("no-ref")
    rows = [{"system": s, "concurrency": 8, "tokens_per_s": t, "tpot_p50_s": 0.1}
            for s, t in (("a", 80.0), ("a", 90.0), ("a", 100.0), ("b", 72.0), ("b", 81.0),
                         ("b", 99.0), ("llama-server", 75.0))]
    by_side = {s["side"]: s for s in summary(rows, ["a", "b"], [8])}
    assert by_side["a"]["tokens_per_s_median"] == 90.0
    assert by_side["b"]["vs_first_side"] == pytest.approx(0.9)
    assert by_side["a"]["vs_llama_server"] == pytest.approx(1.2)
    assert by_side["b"]["tokens_per_s_rounds"] == [72.0, 81.0, 99.0]


def test_llm_bench_client_levels_parse_and_refuse_nonsense() -> None:
    import argparse

    from bench.llm_bench import _levels

    assert _levels("8,32") == [8, 32]
    for bad in ("", "0,8", "eight"):
        with pytest.raises(argparse.ArgumentTypeError):
            _levels(bad)
