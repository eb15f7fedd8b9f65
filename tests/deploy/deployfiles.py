"""The files under deploy/ and every PromQL query they hold, read from the files
themselves: recording rules, alerts, the Grafana dashboard's panels and the autoscaler's
adapter rules. The Prometheus tests evaluate exactly these, so a metric renamed in sluice
without its queries fails them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PROMETHEUS = DEPLOY / "prometheus"
RULE_FILES = sorted((PROMETHEUS / "rules").glob("*.yml"))
ALERT_TESTS = PROMETHEUS / "tests" / "alerts_test.yml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "sluice.json"
K8S = DEPLOY / "k8s"
ADAPTER_RULES = K8S / "prometheus-adapter" / "config.yaml"

#: What Grafana puts in place of the dashboard's variables when it runs a query.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$instance": ".*"}


@dataclass(frozen=True)
class Query:
    """One PromQL query and where it comes from (for failure messages)."""

    source: str
    expr: str


def load_yaml_documents(path: Path) -> list[dict[str, Any]]:
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def rules() -> list[dict[str, Any]]:
    """Every rule of every rule file (recording and alerting)."""
    out: list[dict[str, Any]] = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            out.extend(group["rules"])
    return out


def recording_rules() -> list[Query]:
    return [Query(f"record {r['record']}", r["record"]) for r in rules() if "record" in r]


def alert_names() -> list[str]:
    return [r["alert"] for r in rules() if "alert" in r]


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def dashboard_queries() -> list[Query]:
    """Each panel target's expression, with the variables Grafana would substitute."""
    out = []
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(name, value)
            assert "$" not in expr, f"unhandled variable in {expr}"
            out.append(Query(f"panel {panel['title']!r} {target['refId']}", expr))
    return out


def adapter_config() -> dict[str, Any]:
    """prometheus-adapter's rule config (its ConfigMap is generated from this file)."""
    config: dict[str, Any] = yaml.safe_load(ADAPTER_RULES.read_text())
    return config


def adapter_queries(namespace: str, pod: str) -> list[Query]:
    """Each custom-metrics rule's ``metricsQuery`` as the adapter renders it for one pod
    (its Go template: the series, label matchers for the object, the group-by label)."""
    out = []
    for rule in adapter_config()["rules"]:
        series = rule["seriesQuery"].split("{")[0].strip("'\" ")
        expr = (" ".join(rule["metricsQuery"].split())
                .replace("<<.Series>>", series)
                .replace("<<.LabelMatchers>>", f'namespace="{namespace}",pod=~"{pod}"')
                .replace("<<.GroupBy>>", "pod"))
        assert "<<" not in expr, f"unhandled template field in {expr}"
        out.append(Query(f"adapter metric {rule['name']['as']}", expr))
    return out
