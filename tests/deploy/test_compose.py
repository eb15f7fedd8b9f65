"""deploy/compose.yaml and deploy/Dockerfile, checked offline (no image can be pulled or
built here): the compose file against the Compose specification's JSON schema (as vendored
by check-jsonschema), its references (files, services, ports) against the repository, and
the Dockerfile's stages, user, health check and build context (with docker-py's own
.dockerignore matcher)."""

from __future__ import annotations

import copy
import json
import re
import tomllib
from importlib import resources
from typing import Any

import jsonschema
import pytest
import yaml
from docker.utils.build import exclude_paths

from sluice.config import Config, with_overrides
from tests.deploy.deployfiles import DEPLOY, PROMETHEUS, ROOT

COMPOSE = DEPLOY / "compose.yaml"
DOCKERFILE = DEPLOY / "Dockerfile"


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def _schema_validator() -> jsonschema.protocols.Validator:
    schema = json.loads((resources.files("check_jsonschema.builtin_schemas.vendor")
                         / "compose-spec.json").read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _sluice_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in compose["services"].items() if s.get("image", "")
            .startswith("sluice:")}


def test_compose_file_matches_the_compose_specification() -> None:
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in _schema_validator().iter_errors(_compose())]
    assert not errors, errors


@pytest.mark.parametrize("breakage", ["unknown_key", "bad_port", "bad_depends_on"])
def test_the_schema_rejects_a_broken_compose_file(breakage: str) -> None:
    compose = copy.deepcopy(_compose())
    service = compose["services"]["sluice-1"]
    if breakage == "unknown_key":
        service["replica_count"] = 2
    elif breakage == "bad_port":
        service["ports"] = "8001:8000"  # a list is required
    else:
        service["depends_on"] = {"redis": {"condition": "when_ready"}}
    assert list(_schema_validator().iter_errors(compose))


def test_two_sluice_replicas_share_one_redis() -> None:
    compose = _compose()
    replicas = _sluice_services(compose)
    assert len(replicas) == 2
    assert all(r["depends_on"]["redis"]["condition"] == "service_healthy"
               for r in replicas.values())
    host_ports = [p.rsplit(":", 1)[0] for r in replicas.values() for p in r["ports"]]
    assert len(host_ports) == len(set(host_ports))
    [config_ref] = {c["source"] for r in replicas.values() for c in r["configs"]}
    config = Config.model_validate(tomllib.loads(
        (COMPOSE.parent / compose["configs"][config_ref]["file"]).read_text()))
    assert config.quota.redis_url is None  # the URL carries a password: environment only
    [url] = {r["environment"]["SLUICE_REDIS_URL"] for r in replicas.values()}
    assert url == "redis://:${SLUICE_REDIS_PASSWORD:?set SLUICE_REDIS_PASSWORD}@redis:6379/0"
    # as `sluice serve` applies $SLUICE_REDIS_URL: it selects the shared store
    shared = with_overrides(config, {"quota": {"redis_url": "redis://:pw@redis:6379/0",
                                               "backend": "redis"}})
    assert shared.quota.backend == "redis" and shared.quota.replicas == len(replicas)
    # Each tenant's keys file is a secret mounted where the config says.
    mounted = {f"/run/secrets/{s['target']}" for r in replicas.values() for s in r["secrets"]}
    assert {t.api_keys_file for t in config.tenants} <= mounted
    # Stopping a replica gives it time to drain.
    for r in replicas.values():
        grace_s = float(r["stop_grace_period"].removesuffix("s"))
        assert grace_s > config.server.drain_timeout_s + 1


def test_no_default_secrets_and_every_port_on_loopback() -> None:
    compose = _compose()
    text = COMPOSE.read_text()
    assert "change-me" not in text
    # every secret from the environment, required: ${VAR:?...} (no fallback value)
    for name in ("SLUICE_ADMIN_KEY", "SLUICE_METRICS_KEY", "SLUICE_REDIS_PASSWORD"):
        assert re.search(r"\$\{" + name + r":\?", text), name
        assert not re.search(r"\$\{" + name + r":?-", text), name
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)
    redis = compose["services"]["redis"]
    assert "--requirepass" in " ".join(redis["command"])
    assert "REDIS_PASSWORD" in " ".join(redis["healthcheck"]["test"])
    grafana = compose["services"]["grafana"]["environment"]
    assert grafana["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert grafana["GF_SECURITY_ADMIN_PASSWORD__FILE"] == "/run/secrets/grafana-admin-password"
    assert compose["secrets"]["grafana-admin-password"] == {"environment":
                                                            "GRAFANA_ADMIN_PASSWORD"}
    # Prometheus scrapes with the metrics key the replicas are given
    prom = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    [job] = prom["scrape_configs"]
    [mount] = [s for s in compose["services"]["prometheus"]["secrets"]
               if s["source"] == "metrics-key"]
    assert job["authorization"]["credentials_file"] == f"/run/secrets/{mount['target']}"
    assert compose["secrets"]["metrics-key"] == {"environment": "SLUICE_METRICS_KEY"}


def test_prometheus_scrapes_both_replicas_and_grafana_gets_the_dashboard() -> None:
    compose = _compose()
    prom = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    [job] = prom["scrape_configs"]
    targets = set(job["static_configs"][0]["targets"])
    assert targets == {f"{name}:8000" for name in _sluice_services(compose)}
    for service in ("prometheus", "grafana"):
        for volume in compose["services"][service]["volumes"]:
            host = volume.split(":")[0]
            assert (COMPOSE.parent / host).exists(), volume
    provisioned = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "datasources"
                                  / "prometheus.yml").read_text())["datasources"][0]
    assert provisioned["url"] == "http://prometheus:9090"
    for path in (c["file"] for c in [*compose["configs"].values(),
                                     *compose["secrets"].values()] if "file" in c):
        assert (COMPOSE.parent / path).exists(), path
    build = compose["x-sluice"]["build"]
    assert (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_builds_in_one_stage_and_runs_in_another_as_non_root() -> None:
    steps = _instructions()
    stages = [args for op, args in steps if op == "FROM"]
    assert [s.split()[-1] for s in stages] == ["builder", "runtime"]
    final = steps[max(i for i, (op, _) in enumerate(steps) if op == "FROM"):]
    runtime_ops = [op for op, _ in final]
    # llama-cpp-python's wheel (llama.cpp compiled) comes from the builder, not a compiler
    # in the runtime image.
    builder = steps[:len(steps) - len(final)]
    assert any("llama-cpp-python" in args for op, args in builder if op == "RUN")
    assert not any("build-essential" in args for op, args in final)
    assert any("from=builder" in args for op, args in final if op == "RUN")
    [user] = [args for op, args in final if op == "USER"]
    uid = int(user.split(":")[0])
    assert uid >= 1000  # numeric, so Kubernetes' runAsNonRoot can check it
    assert "HEALTHCHECK" in runtime_ops
    [health] = [args for op, args in final if op == "HEALTHCHECK"]
    assert "/ready" in health
    assert runtime_ops.index("USER") < runtime_ops.index("ENTRYPOINT")


def test_build_context_holds_what_the_dockerfile_copies_and_nothing_heavy() -> None:
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    included = set(exclude_paths(str(ROOT), patterns, dockerfile="deploy/Dockerfile"))
    for op, args in _instructions():
        if op == "COPY" and "--from" not in args:
            *sources, _ = args.split()
            for source in sources:
                assert source.rstrip("/") in included, f"COPY {source}: not in the context"
    assert "sluice/v1/inference.proto" in included
    assert not [p for p in included if p.startswith((".venv", ".git/", "bench/", "tests/"))
                or "_pb2" in p or "__pycache__" in p]


def test_one_image_serves_both_scale_out_paths_through_the_extras_argument() -> None:
    """EXTRAS (default without Ray, `cluster` added for Ray Serve) names extras that
    pyproject.toml declares, and both stages install the same set."""
    steps = _instructions()
    [default] = [args.split("=", 1)[1] for op, args in steps
                 if op == "ARG" and args.startswith("EXTRAS=")]
    declared = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
                   ["optional-dependencies"])
    assert set(default.split(",")) <= declared
    assert "cluster" in declared and "cluster" not in default.split(",")
    assert "cluster" in DOCKERFILE.read_text().split("--build-arg EXTRAS=")[1].split()[0]
    stage_args = [args for op, args in steps if op == "ARG" and args == "EXTRAS"]
    assert len(stage_args) == 2  # redeclared in builder and runtime (ARG scope is a stage)
    installs = [args for op, args in steps if op == "RUN" and "[${EXTRAS}]" in args]
    assert len(installs) == 2
