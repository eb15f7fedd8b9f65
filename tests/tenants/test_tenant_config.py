"""Tenant limits and the ``[quota]`` section: parsing, defaults, and errors that name the
field."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import ValidationError

from sluice.config import QuotaConfig, TenantConfig, TenantLimits
from sluice.policy.capacity.quota import QuotaLimits
from sluice.server.auth import Auth
from tests.server.live import LiveServer, assert_error, config_with


def test_limits_become_per_second_policy_limits() -> None:
    tenant = TenantConfig.model_validate({
        "id": "acme", "api_keys": ["k"], "weight": 3, "priority": 2,
        "default_deadline_ms": 5000,
        "limits": {"requests_per_s": 10, "burst": 20, "tokens_per_min": 6000,
                   "max_concurrent": 4},
    })
    assert tenant.limits.quota_limits() == QuotaLimits(
        requests_per_s=10.0, request_burst=20.0, tokens_per_s=100.0, token_capacity=6000.0,
        max_concurrent=4)
    assert TenantLimits(requests_per_s=0.5).quota_limits().request_burst == 1.0
    assert TenantLimits(requests_per_s=8).quota_limits().request_burst == 8.0
    assert TenantConfig(id="free").limits.quota_limits().unlimited


@pytest.mark.parametrize(("limits", "field"), [
    ({"burst": 5}, "burst"),
    ({"requests_per_s": 0}, "requests_per_s"),
    ({"tokens_per_min": -1}, "tokens_per_min"),
    ({"max_concurrent": 0}, "max_concurrent"),
    ({"requests_per_s": 1, "burst": 0.5}, "burst"),
    ({"rps": 1}, "rps"),
])
def test_bad_limits_name_the_field(limits: dict[str, float], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        TenantConfig.model_validate({"id": "t", "limits": limits})


def test_quota_section() -> None:
    assert QuotaConfig().backend == "memory"
    with pytest.raises(ValidationError, match=r"quota\.redis_url"):
        QuotaConfig(backend="redis")
    cfg = QuotaConfig(backend="redis", redis_url="redis://127.0.0.1:6379/0", replicas=3)
    assert cfg.replicas == 3 and cfg.key_prefix == "sluice"
    with pytest.raises(ValidationError, match="replicas"):
        QuotaConfig(replicas=0)


def test_api_keys_from_a_file_authenticate(tmp_path: Path,
                                           serve: Callable[..., LiveServer]) -> None:
    """Keys in ``api_keys_file`` (a mounted Secret) work like keys in the config file."""
    keys = tmp_path / "acme.keys"
    keys.write_text("# acme's keys\nkey-from-file\n\n  second-key  \n")
    tenant = TenantConfig(id="acme", api_keys=["inline-key"], api_keys_file=str(keys))
    assert tenant.all_api_keys() == ["inline-key", "key-from-file", "second-key"]
    live = serve(config_with(tenants=[tenant.model_dump()]))
    body = {"model": "synth-a", "input": "x"}
    with live.client() as c:
        for key in ("inline-key", "key-from-file", "second-key"):
            r = c.post("/v1/embeddings", json=body, headers={"authorization": f"Bearer {key}"})
            assert r.status_code == 200, r.text
        r = c.post("/v1/embeddings", json=body, headers={"authorization": "Bearer # acme's"})
        assert_error(r, 401, code="invalid_api_key")


def test_an_unreadable_keys_file_is_refused_naming_the_field(tmp_path: Path) -> None:
    tenant = TenantConfig(id="acme", api_keys_file=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match=r"tenants\['acme'\]\.api_keys_file"):
        tenant.all_api_keys()
    shared = tmp_path / "shared.keys"
    shared.write_text("same\n")
    with pytest.raises(ValueError, match="more than one tenant"):
        Auth([TenantConfig(id="a", api_keys=["same"]),
              TenantConfig(id="b", api_keys_file=str(shared))], None)


def test_an_empty_keys_file_is_refused_not_an_open_tenant(tmp_path: Path) -> None:
    keys = tmp_path / "team.keys"
    keys.write_text("# filled in at deploy time\n\n")
    tenant = TenantConfig(id="acme", api_keys_file=str(keys))
    with pytest.raises(ValueError, match=r"tenants\['acme'\]\.api_keys_file: .* holds no key"):
        tenant.all_api_keys()
