"""The ``[cluster]`` table: replicas on Ray Serve."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from sluice.config._base import _Strict


class ClusterConfig(_Strict):
    """Replicas on Ray Serve (``sluice serve --ray``); a plain ``sluice serve`` ignores it, so
    one file serves a single process, Kubernetes replicas and a Ray Serve deployment."""

    address: str | None = None
    """Ray cluster to join (``auto``, ``ray://host:10001``); unset: start a local Ray."""
    min_replicas: int = Field(default=1, ge=1, le=1024)
    max_replicas: int = Field(default=1, ge=1, le=1024)
    initial_replicas: int | None = Field(default=None, ge=1, le=1024)
    num_cpus: float = Field(default=1.0, ge=0)
    """CPUs Ray reserves for each replica (match the workers' threads)."""
    num_gpus: float = Field(default=0.0, ge=0)
    memory_bytes: int | None = Field(default=None, gt=0)
    """Memory Ray reserves for each replica (scheduling only)."""
    resources: dict[str, float] = Field(default_factory=dict)
    """Custom Ray resources each replica needs (e.g. a node label)."""
    router: Literal["affinity", "least_loaded", "round_robin"] = "affinity"
    """Across replicas: residency, then prompt prefix, then load (``affinity``), or a
    baseline."""
    prefix_chars: int = Field(default=256, ge=1, le=1_000_000)
    """Prompts of at least this many characters are hashed on their first this-many, so
    requests sharing a system prompt meet on one replica."""
    load_factor: float = Field(default=1.25, ge=1.0, le=100.0)
    """A prefix's home is passed over once its load would exceed this × the mean."""
    max_ongoing_requests: int | None = Field(default=None, ge=1)
    """Requests one replica holds at once; unset: its queue capacity plus its workers'
    inboxes, so the front end stops sending before the replica would refuse."""
    max_queued_requests: int = Field(default=64, ge=1)
    """Requests a front end holds while every replica is full; past it: 503 at once."""
    target_load_per_replica: float = Field(default=4.0, gt=0)
    """Autoscaling: requests admitted and unfinished per replica to size the fleet for."""
    target_kv_use: float = Field(default=0.8, gt=0, le=1)
    """Autoscaling: KV-block use per replica to size the fleet for."""
    upscale_delay_s: float = Field(default=5.0, ge=0)
    downscale_delay_s: float = Field(default=60.0, ge=0)
    look_back_period_s: float = Field(default=15.0, gt=0)
    """Window over which replica reports are averaged for autoscaling."""
    stats_period_s: float = Field(default=1.0, gt=0)
    """How often each replica reports residency and load to the routers."""
    ingress_replicas: int = Field(default=1, ge=1, le=1024)
    """Front-end replicas (they parse, fingerprint and route; no model)."""
    ingress_num_cpus: float = Field(default=0.25, ge=0)
    health_check_period_s: float = Field(default=5.0, gt=0)
    app_name: str = Field(default="sluice", pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")

    @model_validator(mode="after")
    def _replica_bounds(self) -> ClusterConfig:
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"cluster.max_replicas ({self.max_replicas}) must be >= "
                             f"cluster.min_replicas ({self.min_replicas})")
        initial = self.initial_replicas
        if initial is not None and not self.min_replicas <= initial <= self.max_replicas:
            raise ValueError(f"cluster.initial_replicas ({initial}) must lie in "
                             f"[{self.min_replicas}, {self.max_replicas}]")
        return self
