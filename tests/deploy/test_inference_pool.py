"""deploy/k8s/inference-pool: the InferencePool and HTTPRoute are valid against the
Inference Extension's v1 and the Gateway API's v1 schemas (the fields those CRDs define,
strict: an unknown field is an error), and consistent with sluice's own manifests: the
pool selects the server pods on their HTTP port, the route sends to the pool, and the
metric names the endpoint picker reads by default are ones sluice exports."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import pytest

from tests.deploy.test_k8s import is_extension, objects

_NAME = {"type": "string", "minLength": 1, "maxLength": 253}
_PORT = {"type": "object", "additionalProperties": False, "required": ["number"],
         "properties": {"number": {"type": "integer", "minimum": 1, "maximum": 65535}}}
_LABELS = {"type": "object", "additionalProperties": {
    "type": "string", "maxLength": 63,
    "pattern": r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"}}
_METADATA = {"type": "object", "required": ["name"],
             "properties": {"name": _NAME, "namespace": _NAME, "labels": _LABELS}}

INFERENCE_POOL_V1 = {
    "type": "object", "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "inference.networking.k8s.io/v1"},
        "kind": {"const": "InferencePool"},
        "metadata": _METADATA,
        "spec": {
            "type": "object", "additionalProperties": False,
            "required": ["selector", "targetPorts", "endpointPickerRef"],
            "properties": {
                "selector": {"type": "object", "additionalProperties": False,
                             "required": ["matchLabels"],
                             "properties": {"matchLabels": _LABELS}},
                "targetPorts": {"type": "array", "minItems": 1, "maxItems": 8,
                                "items": _PORT},
                "endpointPickerRef": {
                    "type": "object", "additionalProperties": False, "required": ["name"],
                    "properties": {
                        "group": {"type": "string"},
                        "kind": {"type": "string", "minLength": 1, "maxLength": 63},
                        "name": _NAME,
                        "port": _PORT,
                        "failureMode": {"enum": ["FailOpen", "FailClose"]},
                    },
                },
            },
        },
    },
}

HTTP_ROUTE_V1 = {
    "type": "object", "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "gateway.networking.k8s.io/v1"},
        "kind": {"const": "HTTPRoute"},
        "metadata": _METADATA,
        "spec": {
            "type": "object", "additionalProperties": False,
            "properties": {
                "parentRefs": {"type": "array", "items": {
                    "type": "object", "additionalProperties": False, "required": ["name"],
                    "properties": {"group": {"type": "string"}, "kind": {"type": "string"},
                                   "name": _NAME, "namespace": _NAME,
                                   "sectionName": {"type": "string"}}}},
                "hostnames": {"type": "array", "items": {"type": "string"}},
                "rules": {"type": "array", "items": {
                    "type": "object", "additionalProperties": False,
                    "properties": {
                        "matches": {"type": "array", "items": {
                            "type": "object", "additionalProperties": False,
                            "properties": {"path": {
                                "type": "object", "additionalProperties": False,
                                "properties": {
                                    "type": {"enum": ["Exact", "PathPrefix",
                                                      "RegularExpression"]},
                                    "value": {"type": "string"}}}}}},
                        "backendRefs": {"type": "array", "items": {
                            "type": "object", "additionalProperties": False,
                            "required": ["name"],
                            "properties": {"group": {"type": "string"},
                                           "kind": {"type": "string"}, "name": _NAME,
                                           "port": {"type": "integer"},
                                           "weight": {"type": "integer"}}}},
                        "timeouts": {"type": "object", "additionalProperties": False,
                                     "properties": {"request": {"type": "string"},
                                                    "backendRequest": {"type": "string"}}},
                    },
                }},
            },
        },
    },
}

SCHEMAS = {"InferencePool": INFERENCE_POOL_V1, "HTTPRoute": HTTP_ROUTE_V1}


def extensions() -> list[dict[str, Any]]:
    return [o for o in objects() if is_extension(o)]


def one(kind: str) -> dict[str, Any]:
    [obj] = [o for o in objects() if o["kind"] == kind]
    return obj


def test_every_custom_resource_is_valid_against_its_schema() -> None:
    found = extensions()
    assert {o["kind"] for o in found} == set(SCHEMAS)
    for obj in found:
        jsonschema.validate(obj, SCHEMAS[obj["kind"]])


@pytest.mark.parametrize(("path", "bad"), [
    (("spec", "targetPorts"), [{"port": 8000}]),  # the field is "number"
    (("spec", "endpointPickerRef", "portNumber"), 9002),  # a field v1 does not have
    (("spec", "endpointPickerRef", "failureMode"), "Open"),
])
def test_the_schema_rejects_what_the_api_would(path: tuple[str, ...], bad: object) -> None:
    pool = copy.deepcopy(one("InferencePool"))
    node = pool
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = bad
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(pool, INFERENCE_POOL_V1)


def test_the_pool_selects_the_server_pods_on_their_http_port() -> None:
    pool = one("InferencePool")["spec"]
    [deployment] = [o for o in objects() if o["kind"] == "Deployment"
                    and o["metadata"]["name"] == "sluice"]
    template = deployment["spec"]["template"]
    labels = template["metadata"]["labels"]
    assert pool["selector"]["matchLabels"].items() <= labels.items()
    [container] = template["spec"]["containers"]
    http = {p["name"]: p["containerPort"] for p in container["ports"]}["http"]
    assert [p["number"] for p in pool["targetPorts"]] == [http]
    assert one("InferencePool")["metadata"]["namespace"] == deployment["metadata"]["namespace"]


def test_the_route_sends_to_the_pool() -> None:
    route = one("HTTPRoute")
    pool = one("InferencePool")
    refs = [b for rule in route["spec"]["rules"] for b in rule["backendRefs"]]
    assert refs == [{"group": "inference.networking.k8s.io", "kind": "InferencePool",
                     "name": pool["metadata"]["name"]}]
    assert route["metadata"]["namespace"] == pool["metadata"]["namespace"]


def test_sluice_exports_the_metrics_the_picker_reads_by_default() -> None:
    """The endpoint picker's default metric names, scraped from a real sluice app."""
    from fastapi.testclient import TestClient

    from sluice.server.app import create_app
    from tests.server.live import synthetic_config

    with TestClient(create_app(synthetic_config())) as client:
        text = client.get("/metrics").text
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running",
                 "vllm:kv_cache_usage_perc", "vllm:cache_config_info"):
        assert f"# TYPE {name} gauge" in text, name
