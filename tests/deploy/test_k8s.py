"""deploy/k8s: every manifest valid against the Kubernetes API's schemas (kubernetes-validate,
strict: unknown fields are errors) for the versions sluice supports, and consistent with
itself and with sluice: the ConfigMap's TOML loads with sluice's config loader, the Secret
holds the keys files the TOML names, probes hit /ready and /health, the grace period
outlasts the drain, the HPA reads the metric the adapter serves."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from sluice.config import Config
from tests.deploy.deployfiles import K8S, ROOT, adapter_config, load_yaml_documents

KUBERNETES_VERSIONS = ("1.31.0", "1.35.0")
"""The oldest Kubernetes these manifests target (autoscaling/v2 behaviour, policy/v1 PDB
with unhealthyPodEvictionPolicy, sidecar-free pods) and a recent one."""
KUSTOMIZATIONS = sorted(K8S.rglob("kustomization.yaml"))
EXTENSION_GROUPS = ("inference.networking.k8s.io/", "gateway.networking.k8s.io/")
"""API groups of custom resources (the Gateway API and its Inference Extension), which the
Kubernetes API's own schemas do not cover: tests/deploy/test_inference_pool.py validates
them against theirs."""


def is_extension(obj: dict[str, Any]) -> bool:
    """A custom resource of ``EXTENSION_GROUPS``."""
    return str(obj["apiVersion"]).startswith(EXTENSION_GROUPS)


def _kustomization(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


def _manifest_files() -> list[Path]:
    """Every file a kustomization lists under ``resources``."""
    return [k.parent / r for k in KUSTOMIZATIONS for r in _kustomization(k)["resources"]]


def objects() -> list[dict[str, Any]]:
    """Every object of every kustomization's files."""
    return [doc for path in _manifest_files() for doc in load_yaml_documents(path)]


def _one(kind: str, name: str) -> dict[str, Any]:
    [obj] = [o for o in objects() if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


def _sluice_container() -> dict[str, Any]:
    [container] = _one("Deployment", "sluice")["spec"]["template"]["spec"]["containers"]
    return container


def _toml() -> dict[str, Any]:
    return tomllib.loads(_one("ConfigMap", "sluice-config")["data"]["sluice.toml"])


def test_kustomizations_list_every_manifest_and_only_existing_ones() -> None:
    listed = {p.resolve() for p in _manifest_files()}
    assert all(p.exists() for p in listed), sorted(map(str, listed))
    generated = {k.parent / f for k in KUSTOMIZATIONS
                 for g in _kustomization(k).get("configMapGenerator", []) for f in g["files"]}
    assert all(p.exists() for p in generated)
    on_disk = {p.resolve() for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml"}
    assert on_disk - listed - {p.resolve() for p in generated} == set()


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_is_valid_for_the_kubernetes_api(version: str) -> None:
    every = objects()
    assert len(every) >= 20
    for obj in every:
        if not is_extension(obj):
            kubernetes_validate.validate(obj, version, strict=True)


def test_the_validator_rejects_what_the_api_would() -> None:
    """A field the API does not have (the old v2beta1 HPA target) and a wrong type are
    errors, so the check above means something."""
    hpa = copy.deepcopy(_one("HorizontalPodAutoscaler", "sluice"))
    hpa["spec"]["metrics"][0]["pods"]["targetAverageValue"] = "4"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(hpa, KUBERNETES_VERSIONS[0], strict=True)
    deployment = copy.deepcopy(_one("Deployment", "sluice"))
    deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "45s"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[0], strict=True)


def test_the_configmap_toml_is_a_valid_sluice_config() -> None:
    config = Config.model_validate(_toml())
    assert config.server.host == "0.0.0.0"
    assert config.server.grpc_port is not None
    assert config.quota.redis_url is None, "the URL carries a password: the Secret's"
    assert all(not t.api_keys for t in config.tenants), "keys belong in the Secret"


def test_no_default_secrets_redis_needs_a_password_and_only_sluice_reaches_it() -> None:
    secret = _one("Secret", "sluice-keys")["stringData"]
    assert set(secret.values()) == {""}, "every key is filled in at deploy time"
    env = {e["name"]: e for e in _sluice_container()["env"]}
    for name, key in (("SLUICE_ADMIN_KEY", "admin-key"), ("SLUICE_METRICS_KEY", "metrics-key"),
                      ("SLUICE_REDIS_PASSWORD", "redis-password")):
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": "sluice-keys", "key": key}
    # the quota store's URL carries the password (Kubernetes expands $(VAR) in env values)
    assert env["SLUICE_REDIS_URL"]["value"] == (
        "redis://:$(SLUICE_REDIS_PASSWORD)@redis.sluice.svc:6379/0")
    redis = _one("Deployment", "redis")["spec"]["template"]["spec"]["containers"][0]
    assert "--requirepass \"$REDIS_PASSWORD\"" in " ".join(redis["args"])
    assert "test -n \"$REDIS_PASSWORD\"" in " ".join(redis["args"])
    [pw] = redis["env"]
    assert pw["valueFrom"]["secretKeyRef"] == {"name": "sluice-keys", "key": "redis-password"}
    policy = _one("NetworkPolicy", "redis-from-sluice-only")["spec"]
    redis_labels = _one("Deployment", "redis")["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= redis_labels.items()
    [rule] = policy["ingress"]
    [source] = rule["from"]
    sluice_labels = _one("Deployment", "sluice")["spec"]["template"]["metadata"]["labels"]
    assert source["podSelector"]["matchLabels"].items() <= sluice_labels.items()
    assert rule["ports"] == [{"protocol": "TCP", "port": 6379}]


def test_tenant_keys_files_come_from_the_secret() -> None:
    config = Config.model_validate(_toml())
    secret = _one("Secret", "sluice-keys")["stringData"]
    container = _sluice_container()
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "keys"]
    volumes = _one("Deployment", "sluice")["spec"]["template"]["spec"]["volumes"]
    [keys] = [v for v in volumes if v["name"] == "keys"]
    mounted = {f"{mount['mountPath']}/{item['path']}": item["key"]
               for item in keys["secret"]["items"]}
    for tenant in config.tenants:
        assert tenant.api_keys_file in mounted, tenant.id
        assert mounted[tenant.api_keys_file] in secret
    [admin] = [e for e in container["env"] if e["name"] == "SLUICE_ADMIN_KEY"]
    assert admin["valueFrom"]["secretKeyRef"]["key"] in secret


def test_probes_ports_and_drain() -> None:
    container = _sluice_container()
    config = Config.model_validate(_toml())
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": config.server.port, "grpc": config.server.grpc_port}
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    startup = container["startupProbe"]
    # The model load gets minutes, liveness only starts after it.
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120
    pause_s = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    grace_s = _one("Deployment", "sluice")["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"]
    # preStop, then SIGTERM: drain (server.drain_timeout_s) and uvicorn's last second.
    assert grace_s > pause_s + config.server.drain_timeout_s + 1


def test_pods_run_as_non_root_on_a_read_only_filesystem() -> None:
    for obj in objects():
        if obj["kind"] != "Deployment":
            continue
        pod = obj["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, obj["metadata"]["name"]
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, c["name"]
            assert sc["allowPrivilegeEscalation"] is False, c["name"]
            assert sc["capabilities"]["drop"] == ["ALL"], c["name"]
            assert "memory" in c["resources"]["limits"], c["name"]


def test_selectors_match_the_pods() -> None:
    labels = _one("Deployment", "sluice")["spec"]["template"]["metadata"]["labels"]
    for kind, name in [("Service", "sluice"), ("Service", "sluice-grpc")]:
        selector = _one(kind, name)["spec"]["selector"]
        assert selector.items() <= labels.items(), name
    pdb = _one("PodDisruptionBudget", "sluice")["spec"]["selector"]["matchLabels"]
    assert pdb.items() <= labels.items()


def test_the_autoscaler_reads_the_metric_the_adapter_serves() -> None:
    hpa = _one("HorizontalPodAutoscaler", "sluice")["spec"]
    assert hpa["scaleTargetRef"]["name"] == "sluice"
    assert hpa["minReplicas"] >= 2  # with the PDB, one pod may move at a time
    assert _one("PodDisruptionBudget", "sluice")["spec"]["minAvailable"] < hpa["minReplicas"]
    [metric] = hpa["metrics"]
    served = {rule["name"]["as"] for rule in adapter_config()["rules"]}
    assert metric["pods"]["metric"]["name"] in served
    # Redis down: each pod enforces 1/quota.replicas, so at most the limit in total.
    assert Config.model_validate(_toml()).quota.replicas == hpa["maxReplicas"]


def test_the_hpa_target_is_the_one_docs_derive() -> None:
    target = _one("HorizontalPodAutoscaler", "sluice")["spec"]["metrics"][0]["pods"][
        "target"]["averageValue"]
    docs = (ROOT / "docs" / "operations.md").read_text()
    match = re.search(r"averageValue: \"(\d+)\"", docs)
    assert match is not None, "docs/operations.md does not state the HPA target"
    assert match.group(1) == str(target)


def test_the_kustomization_pins_the_sluice_image() -> None:
    images = {i["name"] for i in _kustomization(K8S / "kustomization.yaml")["images"]}
    assert _sluice_container()["image"] in images


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS, ids=lambda p: p.parent.name)
def test_kustomize_renders_what_was_validated(kustomization: Path) -> None:
    """``kubectl kustomize`` (when kubectl is installed; the checks above read the same
    files directly) renders every listed object, generated ones included, and each is
    valid."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed; the manifests were validated file by file")
    proc = subprocess.run([kubectl, "kustomize", str(kustomization.parent)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rendered = [d for d in yaml.safe_load_all(proc.stdout) if d]
    listed = [doc for r in _kustomization(kustomization)["resources"]
              for doc in load_yaml_documents(kustomization.parent / r)]
    generated = _kustomization(kustomization).get("configMapGenerator", [])
    assert len(rendered) == len(listed) + len(generated)
    for obj in rendered:
        if not is_extension(obj):
            kubernetes_validate.validate(obj, KUBERNETES_VERSIONS[0], strict=True)
    images = {c["image"] for o in rendered if o["kind"] == "Deployment"
              for c in o["spec"]["template"]["spec"]["containers"]}
    assert "sluice" not in images  # the kustomization pinned it
