"""deploy/prometheus checked by Prometheus' own ``promtool``: the scrape configuration and
rule files are valid, and the alerts' unit tests pass; every alert has a unit test."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.deploy.deployfiles import ALERT_TESTS, PROMETHEUS, RULE_FILES, alert_names


def _run(*args: str) -> str:
    proc = subprocess.run(args, cwd=PROMETHEUS, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def test_scrape_config_is_valid(promtool: str, tmp_path: Path) -> None:
    """The committed configuration, with the metrics key file it reads (a Compose secret,
    ``/run/secrets/metrics-key``) put where this machine has one: promtool checks that the
    file exists."""
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    [job] = config["scrape_configs"]
    assert job["authorization"]["credentials_file"] == "/run/secrets/metrics-key"
    key = tmp_path / "metrics-key"
    key.write_text("a-metrics-key\n")
    job["authorization"]["credentials_file"] = str(key)
    config["rule_files"] = [str(PROMETHEUS / r) for r in config["rule_files"]]
    checked = tmp_path / "prometheus.yml"
    checked.write_text(yaml.safe_dump(config))
    out = _run(promtool, "check", "config", str(checked))
    assert f"{len(RULE_FILES)} rule files found" in out


def test_rule_files_are_valid(promtool: str) -> None:
    out = _run(promtool, "check", "rules", *map(str, RULE_FILES))
    assert out.count("SUCCESS") == len(RULE_FILES)


def test_alert_unit_tests_pass(promtool: str) -> None:
    out = _run(promtool, "test", "rules", str(ALERT_TESTS))
    assert "SUCCESS" in out


def test_every_alert_has_a_unit_test_that_expects_it_to_fire() -> None:
    tests = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
    fired = {case["alertname"] for t in tests for case in t.get("alert_rule_test", [])
             if case.get("exp_alerts")}
    assert alert_names(), "no alerts found"
    missing = sorted(set(alert_names()) - fired)
    assert not missing, f"alerts without a firing test: {missing}"


def test_a_broken_alert_fails_its_unit_test(promtool: str, tmp_path: Path) -> None:
    """The unit tests can fail: with the error-rate threshold raised past the test's 10%,
    promtool reports the missing alert."""
    (tmp_path / "rules").mkdir()
    (tmp_path / "tests").mkdir()
    for path in RULE_FILES:
        text = path.read_text()
        if path.name == "alerts.yml":
            assert "sluice:request_errors:ratio_rate5m > 0.05" in text
            text = text.replace("sluice:request_errors:ratio_rate5m > 0.05",
                                "sluice:request_errors:ratio_rate5m > 0.5")
        (tmp_path / "rules" / path.name).write_text(text)
    (tmp_path / "tests" / ALERT_TESTS.name).write_text(ALERT_TESTS.read_text())
    proc = subprocess.run([promtool, "test", "rules", str(tmp_path / "tests" / ALERT_TESTS.name)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "SluiceHighErrorRate" in proc.stdout + proc.stderr
