"""Tenant limits and the ``[quota]`` section: parsing, defaults, and errors that name the
field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sluice.config import QuotaConfig, TenantConfig, TenantLimits
from sluice.policy.quota import QuotaLimits


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
