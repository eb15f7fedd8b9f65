"""Write deploy/grafana/dashboards/sluice.json, the sluice dashboard, from the panel list
below (``python deploy/grafana/make_dashboard.py``; ``--check`` fails if the file differs).

The panel list is the one place the dashboard's queries live: the JSON is generated from
it, and tests/deploy/test_prometheus_live.py evaluates every query of the JSON against a
real Prometheus scraping a live sluice (each must return data). Queries use the metric
names of sluice/server/metrics.py and the recording rules of deploy/prometheus/rules.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "dashboards" / "sluice.json"
DATASOURCE = {"type": "prometheus", "uid": "prometheus"}
SEL = 'instance=~"$instance"'
RATE = "$__rate_interval"


def rate(metric: str, by: str, extra: str = "") -> str:
    """``sum by (by) (rate(metric{instance, extra}[$__rate_interval]))``."""
    sel = f"{SEL},{extra}" if extra else SEL
    return f"sum by ({by}) (rate({metric}{{{sel}}}[{RATE}]))"


def quantile(q: float, histogram: str, by: str = "model") -> str:
    return (f"histogram_quantile({q}, sum by (le, {by}) "
            f"(rate({histogram}_bucket{{{SEL}}}[{RATE}])))")


@dataclass(frozen=True)
class Panel:
    title: str
    targets: list[tuple[str, str]]
    """(PromQL, legend)."""
    unit: str = "short"
    kind: str = "timeseries"
    width: int = 8
    stack: bool = False
    description: str = ""
    thresholds: list[tuple[float, str]] = field(default_factory=list)


ROWS: list[tuple[str, list[Panel]]] = [
    ("Load and admission", [
        Panel("Queue depth", [
            (f"sum by (instance) (sluice_queue_depth{{{SEL}}})", "queued {{instance}}"),
            (f"sluice:requests_waiting{{{SEL}}}", "waiting (queue + inboxes) {{instance}}"),
            (f"sum by (instance) (sluice_queue_capacity{{{SEL}}})", "capacity {{instance}}"),
        ], description="Requests admitted and not yet running. Waiting per pod is the "
                       "autoscaler's metric."),
        Panel("Admissions and rejections by reason", [
            (rate("sluice_admitted_total", "model"), "admitted {{model}}"),
            (rate("sluice_rejections_total", "reason"), "rejected: {{reason}}"),
        ], unit="reqps", description="Refusals at admission: queue_full (503), quota "
                                     "(429), deadline_infeasible, draining."),
        Panel("Requests by outcome", [
            (rate("sluice_requests_total", "state"), "{{state}}"),
        ], unit="reqps", stack=True),
        Panel("Goodput", [
            (rate("sluice_goodput_total", "model"), "in time {{model}}"),
        ], unit="reqps", description="Completed requests that met their deadline (or had "
                                     "none)."),
        Panel("Goodput ratio (5m)", [
            ("sluice:goodput:ratio_rate5m", "{{job}}"),
        ], unit="percentunit", kind="stat", width=4,
            thresholds=[(0, "red"), (0.9, "orange"), (0.99, "green")]),
        Panel("Error ratio (5m)", [
            ("sluice:request_errors:ratio_rate5m", "{{job}}"),
        ], unit="percentunit", kind="stat", width=4,
            thresholds=[(0, "green"), (0.01, "orange"), (0.05, "red")],
            description="Backend failures and deadlines passed after admission."),
    ]),
    ("Latency", [
        Panel("Time to first token", [
            (quantile(0.5, "sluice_time_to_first_token_seconds"), "p50 {{model}}"),
            (quantile(0.95, "sluice_time_to_first_token_seconds"), "p95 {{model}}"),
            ("sluice:slo:ttft_p95_seconds", "p95 objective"),
        ], unit="s"),
        Panel("Time per output token and inter-token latency", [
            (quantile(0.5, "sluice_time_per_output_token_seconds"), "TPOT p50 {{model}}"),
            (quantile(0.95, "sluice_time_per_output_token_seconds"), "TPOT p95 {{model}}"),
            (quantile(0.95, "sluice_inter_token_latency_seconds"), "ITL p95 {{model}}"),
        ], unit="s", description="TPOT: each request's mean gap between its tokens. ITL: "
                                 "every gap, so its tail shows the stalls a mean hides."),
        Panel("Queue wait: measured and predicted", [
            (quantile(0.95, "sluice_queue_wait_seconds"), "measured p95 {{model}}"),
            (quantile(0.95, "sluice_predicted_wait_seconds"), "predicted p95 {{model}}"),
        ], unit="s", description="Predicted: the variant planner's Erlang-C wait for the "
                                 "variant it chose."),
    ]),
    ("Throughput and capacity", [
        Panel("Tokens per second", [
            (rate("sluice_tokens_total", "model, kind"), "{{kind}} {{model}}"),
        ], unit="short", stack=True),
        Panel("Batch size (mean)", [
            (f"{rate('sluice_batch_size_sum', 'model')} / "
             f"{rate('sluice_batch_size_count', 'model')}", "{{model}}"),
        ], description="Members of each one-shot batch or decode step."),
        Panel("KV cache in use", [
            (f"max by (instance, model) (sluice_kv_usage_ratio{{{SEL}}})",
             "{{model}} {{instance}}"),
        ], unit="percentunit"),
        Panel("Variant mix", [
            (rate("sluice_variant_choices_total", "group, variant"), "{{group}}: {{variant}}"),
            (rate("sluice_planner_rejections_total", "group"), "{{group}}: rejected"),
        ], unit="reqps", stack=True, description="Variants the planner chose per group, and "
                                                 "requests no variant could serve in time."),
    ]),
    ("Tenants", [
        Panel("Tokens per second by tenant", [
            (rate("sluice_tokens_total", "tenant"), "{{tenant}}"),
        ], stack=True),
        Panel("Quota refusals (429) by tenant", [
            (rate("sluice_quota_rejections_total", "tenant, limit"), "{{tenant}}: {{limit}}"),
        ], unit="reqps"),
        Panel("Requests in flight by tenant", [
            (f"sum by (tenant) (sluice_quota_in_flight{{{SEL}}})", "{{tenant}}"),
        ]),
    ]),
    ("Health", [
        Panel("Workers up", [
            (f"sum(sluice_worker_up{{{SEL}}})", "up"),
            (f"count(sluice_worker_up{{{SEL}}})", "workers"),
        ], kind="stat", width=6),
        Panel("Quota store fallback", [
            (f"max(sluice_quota_fallback{{{SEL}}})", "in fallback"),
        ], kind="stat", width=6, thresholds=[(0, "green"), (1, "red")],
            description="1 while a replica cannot reach Redis and enforces its local share."),
        Panel("Replicas scraped", [
            ('sum(up{job="sluice"})', "up"),
        ], kind="stat", width=6),
        Panel("Draining", [
            (f"max(sluice_draining{{{SEL}}})", "draining"),
        ], kind="stat", width=6, thresholds=[(0, "green"), (1, "orange")]),
    ]),
]


def _panel(p: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    steps = [{"color": color, "value": None if i == 0 else value}
             for i, (value, color) in enumerate(p.thresholds or [(0, "green")])]
    panel: dict[str, Any] = {
        "id": panel_id,
        "type": p.kind,
        "title": p.title,
        "description": p.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": 8 if p.kind == "timeseries" else 4, "w": p.width, "x": x, "y": y},
        "fieldConfig": {
            "defaults": {"unit": p.unit,
                         "thresholds": {"mode": "absolute", "steps": steps}},
            "overrides": [],
        },
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": expr,
             "legendFormat": legend, "range": True}
            for i, (expr, legend) in enumerate(p.targets)
        ],
    }
    if p.kind == "timeseries":
        panel["fieldConfig"]["defaults"]["custom"] = {
            "stacking": {"mode": "normal" if p.stack else "none"}, "fillOpacity": 10}
        panel["options"] = {"legend": {"displayMode": "list", "placement": "bottom"},
                            "tooltip": {"mode": "multi"}}
    else:
        panel["options"] = {"reduceOptions": {"calcs": ["lastNotNull"]},
                            "colorMode": "value", "graphMode": "area"}
    return panel


def build() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (schema version 39)."""
    panels: list[dict[str, Any]] = []
    panel_id, y = 1, 0
    for title, row in ROWS:
        panels.append({"id": panel_id, "type": "row", "title": title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        panel_id, y, x, row_h = panel_id + 1, y + 1, 0, 0
        for p in row:
            if x + p.width > 24:
                x, y, row_h = 0, y + row_h, 0
            panels.append(_panel(p, panel_id, x, y))
            h = panels[-1]["gridPos"]["h"]
            panel_id, x, row_h = panel_id + 1, x + p.width, max(row_h, h)
        y += row_h
    return {
        "uid": "sluice-overview",
        "title": "sluice",
        "description": "sluice: admission, latency, capacity, tenants and health "
                       "(docs/operations.md, 'Read the dashboard').",
        "tags": ["sluice"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": False,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [{
            "name": "instance",
            "label": "replica",
            "type": "query",
            "datasource": DATASOURCE,
            "query": {"query": "label_values(sluice_queue_depth, instance)",
                      "refId": "instance"},
            "definition": "label_values(sluice_queue_depth, instance)",
            "refresh": 2,
            "includeAll": True,
            "multi": True,
            "allValue": ".*",
            "current": {"text": "All", "value": "$__all"},
        }]},
        "annotations": {"list": []},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is out of date: run python {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
