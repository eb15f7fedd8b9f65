"""The ``[[tenants]]`` tables (API keys, weight, priority, deadlines, quotas) and where
the quotas live (``[quota]``: this process or a Redis shared by replicas)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from sluice.config._base import _Strict
from sluice.policy.capacity.quota import QuotaLimits


class TenantLimits(_Strict):
    """A tenant's quotas; a limit left out is not enforced (see ``sluice.server.quota``)."""

    requests_per_s: float | None = Field(default=None, gt=0)
    """Sustained requests per second; one HTTP request counts once."""
    burst: float | None = Field(default=None, ge=1)
    """Requests admitted at once from a full bucket (default: max(1, requests_per_s))."""
    tokens_per_min: float | None = Field(default=None, gt=0)
    """Prompt + generated tokens per minute; the bucket holds one minute's worth, so it is
    also the largest single request."""
    max_concurrent: int | None = Field(default=None, ge=1)
    """Requests of the tenant admitted and not yet finished."""

    @model_validator(mode="after")
    def _burst_needs_rate(self) -> TenantLimits:
        if self.burst is not None and self.requests_per_s is None:
            raise ValueError(f"limits.burst ({self.burst}) needs limits.requests_per_s")
        return self

    def quota_limits(self) -> QuotaLimits:
        """The limits as the quota policy takes them (per second)."""
        rate = self.requests_per_s
        return QuotaLimits(
            requests_per_s=rate,
            request_burst=self.burst if self.burst is not None else max(1.0, rate or 1.0),
            tokens_per_s=None if self.tokens_per_min is None else self.tokens_per_min / 60.0,
            token_capacity=self.tokens_per_min or 1.0,
            max_concurrent=self.max_concurrent,
        )


class TenantConfig(_Strict):
    """A tenant: its API keys (plain in the file, hashed in memory), weight, priority,
    default deadline and quotas."""

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    api_keys: list[str] = Field(default_factory=list)
    api_keys_file: str | None = None
    """A file with more keys, one per line (blank lines and ``#`` comments skipped): a
    mounted Kubernetes Secret or Docker secret keeps them out of this file. Read when the
    server starts."""
    weight: float = Field(default=1.0, gt=0)
    """Share of served tokens under the ``wfq`` scheduler, relative to other tenants."""
    priority: int = Field(default=5, ge=0, le=9)
    """Default priority class (0 most urgent) when a request names none."""
    priority_ceiling: int | None = Field(default=None, ge=0, le=9)
    """The most urgent class the tenant's requests may ask for (body ``priority`` or the
    ``x-sluice-priority`` header); a request asking for more is served at the ceiling. Unset:
    ``priority`` (a request may only lower its priority). Unconfigured tenants of an open
    server get the ``default`` tenant's."""

    @model_validator(mode="after")
    def _ceiling_above_default(self) -> TenantConfig:
        if self.priority_ceiling is not None and self.priority_ceiling > self.priority:
            raise ValueError(f"tenants[{self.id!r}].priority_ceiling ({self.priority_ceiling}) "
                             f"must be <= priority ({self.priority}): 0 is most urgent")
        return self

    @property
    def most_urgent_priority(self) -> int:
        """The ceiling: the smallest priority class a request of this tenant gets."""
        return self.priority if self.priority_ceiling is None else self.priority_ceiling
    default_deadline_ms: float | None = Field(default=None, gt=0)
    default_ttft_deadline_ms: float | None = Field(default=None, gt=0)
    """First-token deadline of the tenant's generative requests that bring none (before
    the model's ``ttft_deadline_ms``)."""
    default_ttft_target_ms: float | None = Field(default=None, gt=0)
    """First-token target (soft) of the tenant's generative requests that bring none
    (before the model's ``ttft_target_ms``)."""
    limits: TenantLimits = Field(default_factory=TenantLimits)

    def all_api_keys(self) -> list[str]:
        """``api_keys`` and those in ``api_keys_file`` (``ValueError`` naming the field if
        the file cannot be read or holds no key: an empty mounted secret would otherwise
        leave the tenant open to anyone who claims it)."""
        keys = list(self.api_keys)
        if self.api_keys_file is not None:
            try:
                text = Path(self.api_keys_file).read_text()
            except OSError as exc:
                raise ValueError(f"tenants[{self.id!r}].api_keys_file: cannot read "
                                 f"{self.api_keys_file}: {exc.strerror}") from None
            from_file = [k for k in (line.strip() for line in text.splitlines())
                         if k and not k.startswith("#")]
            if not from_file:
                raise ValueError(f"tenants[{self.id!r}].api_keys_file: {self.api_keys_file} "
                                 "holds no key")
            keys += from_file
        return keys


class QuotaConfig(_Strict):
    """Where tenant quotas live: this process (``memory``) or a Redis shared by replicas."""

    backend: Literal["memory", "redis"] = "memory"
    redis_url: str | None = None
    """e.g. ``redis://127.0.0.1:6379/0``; also ``$SLUICE_REDIS_URL`` (which selects redis)."""
    replicas: int = Field(default=1, ge=1, le=10_000)
    """Replicas sharing the quotas: while Redis is unreachable each enforces 1/replicas."""
    key_prefix: str = Field(default="sluice", pattern=r"^[A-Za-z0-9._:-]{1,64}$")
    timeout_ms: float = Field(default=250.0, gt=0, le=60_000)
    """Longest wait for one Redis call before falling back to local buckets."""
    reconnect_interval_s: float = Field(default=1.0, gt=0, le=3600)
    """How often a replica in fallback probes Redis."""
    lease_s: float = Field(default=600.0, gt=0)
    """How long a concurrency slot outlives a replica that died holding it."""

    @model_validator(mode="after")
    def _redis_needs_url(self) -> QuotaConfig:
        if self.backend == "redis" and not self.redis_url:
            raise ValueError("quota.redis_url is required when quota.backend = 'redis'")
        return self


def hash_key(key: str) -> str:
    """How API keys are held in memory: SHA-256 hex digest, never the key itself."""
    return hashlib.sha256(key.encode()).hexdigest()
