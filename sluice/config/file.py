"""``Config``: the whole configuration file, the checks that span its tables, and the
``RuntimeConfig`` the runtime is built from."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from sluice.config._base import _Strict
from sluice.config.cluster import ClusterConfig
from sluice.config.execution import (
    BatchingConfig,
    ConstraintsConfig,
    EngineSection,
    SchedulingConfig,
    WorkersConfig,
)
from sluice.config.models import GroupConfig, ModelConfig
from sluice.config.server import ServerConfig
from sluice.config.tenants import QuotaConfig, TenantConfig
from sluice.engine.continuous import EngineConfig
from sluice.engine.runtime import RuntimeConfig
from sluice.engine.variants import GroupSpec
from sluice.policy.queues.control_core import QueueConfig
from sluice.policy.variants.planner import PlannerConfig
from sluice.policy.worker_config import WorkerConfig


class Config(_Strict):
    """The whole configuration file."""

    server: ServerConfig = Field(default_factory=ServerConfig)
    scheduling: SchedulingConfig = Field(default_factory=SchedulingConfig)
    workers: WorkersConfig = Field(default_factory=WorkersConfig)
    batching: BatchingConfig = Field(default_factory=BatchingConfig)
    engine: EngineSection = Field(default_factory=EngineSection)
    constraints: ConstraintsConfig = Field(default_factory=ConstraintsConfig)
    models: list[ModelConfig] = Field(min_length=1)
    tenants: list[TenantConfig] = Field(default_factory=list)
    groups: list[GroupConfig] = Field(default_factory=list)
    quota: QuotaConfig = Field(default_factory=QuotaConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)

    @field_validator("models")
    @classmethod
    def _unique_models(cls, models: list[ModelConfig]) -> list[ModelConfig]:
        ids = [i for m in models for i in (m.id, m.embedding_id, m.rerank_id) if i is not None]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"duplicate model ids: {dupes}")
        return models

    @model_validator(mode="after")
    def _check_refs(self) -> Config:
        ids = {m.id for m in self.models}
        if self.server.default_model is not None and self.server.default_model not in ids:
            raise ValueError(
                f"server.default_model {self.server.default_model!r} is not a configured model"
            )
        for alias, target in self.server.model_aliases.items():
            if target not in ids:
                raise ValueError(f"server.model_aliases[{alias!r}]: {target!r} is not a "
                                 f"configured model")
            if alias in ids:
                raise ValueError(f"server.model_aliases[{alias!r}]: already a model id")
        by_id = {m.id: m for m in self.models}
        for g in self.groups:
            if g.id in by_id:
                raise ValueError(f"groups: {g.id!r} is also a model id")
            members = [by_id.get(v) for v in g.variants]
            missing = [v for v, m in zip(g.variants, members, strict=True) if m is None]
            if missing:
                raise ValueError(f"groups[{g.id!r}].variants: unknown models {missing}")
            shapes = {(m.kind, m.task) for m in members if m is not None}
            if len(shapes) != 1 or any(kind != "oneshot" for kind, _ in shapes):
                raise ValueError(f"groups[{g.id!r}].variants must be one-shot models of one "
                                 f"task, got {sorted(shapes)}")
        for m in self.models:
            if (m.faults is not None and m.faults.kill_mode != "raise"
                    and self.workers.isolation != "process"):
                raise ValueError(f"models[{m.id!r}].faults.kill_mode = "
                                 f"{m.faults.kill_mode!r} ends a process: it needs "
                                 f"workers.isolation = \"process\"")
        keys = [k for t in self.tenants for k in t.api_keys]
        if len(set(keys)) != len(keys):
            raise ValueError("tenants: an API key is listed for more than one tenant")
        return self

    @property
    def default_model(self) -> str:
        return self.server.default_model or self.models[0].id

    def runtime_config(self) -> RuntimeConfig:
        engine = EngineConfig(
            mode=self.engine.mode,
            max_batch_tokens=self.engine.max_batch_tokens,
            prefill_chunk_tokens=self.engine.prefill_chunk_tokens,
            kv_block_tokens=self.engine.kv_block_tokens,
            static_max_wait_s=self.engine.static_max_wait_ms / 1000.0,
            prefix_reuse=self.engine.prefix_reuse,
            min_prefix_tokens=self.engine.min_prefix_tokens,
            retain_prefixes=self.engine.retain_prefixes,
            max_retained_slots=self.engine.max_retained_slots,
            cache_ram_bytes=(None if self.engine.cache_ram_mib < 0
                             else self.engine.cache_ram_mib * 2**20),
            share_prefix_across_tenants=self.engine.share_prefix_across_tenants,
            line_order="priority_deadline" if self.scheduling.scheduler == "priority_edf"
            else "arrival",
        )
        workers = tuple(
            WorkerConfig(
                worker_id=i,
                budget_bytes=self.workers.budget_bytes,
                inbox_capacity=self.workers.inbox_capacity,
                eviction=self.workers.eviction,
                max_batch_size=self.batching.max_batch_size,
                max_wait_s=self.batching.max_wait_ms / 1000.0,
                engine=engine,
                watchdog_s=self.workers.watchdog_s,
                load_watchdog_s=self.workers.load_watchdog_s,
            )
            for i in range(self.workers.count)
        )
        return RuntimeConfig(
            models=tuple(s for m in self.models for s in m.specs()),
            workers=workers,
            queue=QueueConfig(
                scheduler=self.scheduling.scheduler,
                bypass_threshold=self.scheduling.bypass_threshold,
                router=self.scheduling.router,
                queue_capacity=self.scheduling.queue_capacity,
                tenant_weights={t.id: t.weight for t in self.tenants},
            ),
            faults={m.id: m.faults.plan() for m in self.models if m.faults is not None},
            trace_path=self.server.trace_file,
            isolation=self.workers.isolation,
            groups=tuple(
                GroupSpec(
                    group_id=g.id,
                    variants=tuple(g.variants),
                    planner=PlannerConfig(
                        policy=g.policy, pessimism=g.pessimism,
                        low_load_utilization=g.low_load_utilization,
                        low_load_confidence_z=g.low_load_confidence_z,
                        max_batch_size=self.batching.max_batch_size,
                    ),
                    default_deadline_s=None if g.default_deadline_ms is None
                    else g.default_deadline_ms / 1000.0,
                )
                for g in self.groups
            ),
        )
