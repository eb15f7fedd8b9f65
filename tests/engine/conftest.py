"""Builders for runtimes on the synthetic backend (no model, fast cost model)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sluice.backends.base import ModelSpec
from sluice.backends.synthetic import SyntheticBackend
from sluice.engine.continuous import EngineConfig
from sluice.engine.runtime import Runtime, RuntimeConfig
from sluice.policy.queues.control_core import QueueConfig
from sluice.policy.worker_config import WorkerConfig

MB = 1_000_000


def oneshot(model_id: str, memory_mb: int = 100, **options: Any) -> ModelSpec:
    opts = {"batch_fixed_s": 0.002, "per_item_s": 0.0005, "load_s": 0.005, **options}
    return ModelSpec(model_id, "oneshot", "synthetic", memory_mb * MB, options=opts)


def generative(model_id: str = "chat", memory_mb: int = 100, **options: Any) -> ModelSpec:
    opts = {
        "step_fixed_s": 0.001, "decode_per_seq_s": 0.0002, "prefill_per_token_s": 0.00001,
        "load_s": 0.005, "n_seq_max": 4, "n_ctx_per_seq": 128, **options,
    }
    return ModelSpec(model_id, "generative", "synthetic", memory_mb * MB, options=opts)


def make_runtime(
    models: list[ModelSpec],
    *,
    workers: int = 1,
    budget_mb: int = 1000,
    inbox: int = 8,
    queue: int = 32,
    scheduler: str = "fifo",
    router: str = "residency_aware",
    max_batch: int = 4,
    max_wait_s: float = 0.002,
    engine: EngineConfig | None = None,
    eviction: str = "lru",
) -> Runtime:
    config = RuntimeConfig(
        models=tuple(models),
        workers=tuple(
            WorkerConfig(
                worker_id=i, budget_bytes=budget_mb * MB, inbox_capacity=inbox,
                eviction=eviction, max_batch_size=max_batch, max_wait_s=max_wait_s,
                engine=engine or EngineConfig(),
            )
            for i in range(workers)
        ),
        queue=QueueConfig(scheduler=scheduler, router=router, queue_capacity=queue),
    )
    return Runtime(config, {"synthetic": SyntheticBackend()})


@pytest.fixture
def runtime_factory() -> Iterator[Any]:
    """Build runtimes that are stopped at teardown."""
    made: list[Runtime] = []

    def build(*args: Any, start: bool = True, **kwargs: Any) -> Runtime:
        rt = make_runtime(*args, **kwargs)
        made.append(rt)
        if start:
            rt.start()
        return rt

    yield build
    for rt in made:
        rt.stop(drain_timeout_s=0.5)
