"""deploy/grafana: the dashboard JSON is what make_dashboard.py generates, its panels use
the provisioned datasource, lay out without overlapping, and show what an operator needs
(each query's data is checked in test_prometheus_live.py)."""

from __future__ import annotations

import subprocess
import sys

import yaml

from tests.deploy.deployfiles import DEPLOY, dashboard

GRAFANA = DEPLOY / "grafana"

#: What the dashboard must show → a metric or recording rule some panel's query reads.
REQUIRED = {
    "queue depth": "sluice_queue_depth",
    "admissions": "sluice_admitted_total",
    "rejections by reason": "sluice_rejections_total",
    "TTFT": "sluice_time_to_first_token_seconds_bucket",
    "TPOT": "sluice_time_per_output_token_seconds_bucket",
    "ITL": "sluice_inter_token_latency_seconds_bucket",
    "tokens/s": "sluice_tokens_total",
    "batch size": "sluice_batch_size_sum",
    "KV use": "sluice_kv_usage_ratio",
    "variant mix": "sluice_variant_choices_total",
    "predicted wait": "sluice_predicted_wait_seconds_bucket",
    "per-tenant 429s": "sluice_quota_rejections_total",
    "goodput": "sluice_goodput_total",
    "quota store fallback": "sluice_quota_fallback",
    "workers up": "sluice_worker_up",
}


def test_dashboard_json_is_generated_from_the_panel_list() -> None:
    proc = subprocess.run([sys.executable, str(GRAFANA / "make_dashboard.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_panels_use_the_provisioned_datasource_and_do_not_overlap() -> None:
    provisioned = yaml.safe_load((GRAFANA / "provisioning" / "datasources"
                                  / "prometheus.yml").read_text())["datasources"]
    uids = {d["uid"] for d in provisioned}
    panels = dashboard()["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] in uids
        assert p["targets"], p["title"]
        assert all(t["datasource"]["uid"] in uids for t in p["targets"])
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"])


def test_the_dashboard_shows_what_an_operator_needs() -> None:
    exprs = " ".join(t["expr"] for p in dashboard()["panels"] for t in p.get("targets", []))
    missing = [what for what, metric in REQUIRED.items() if metric not in exprs]
    assert not missing, missing


def test_the_dashboard_provider_loads_the_folder_compose_mounts() -> None:
    provider = yaml.safe_load((GRAFANA / "provisioning" / "dashboards"
                               / "sluice.yml").read_text())["providers"][0]
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    mounts = dict(v.split(":")[:2] for v in compose["services"]["grafana"]["volumes"])
    assert mounts["./grafana/dashboards"] == provider["options"]["path"]
