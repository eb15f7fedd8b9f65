"""One source of configuration: a TOML file parsed into validated pydantic models, with
CLI flags and ``SLUICE_*`` environment variables applied over it (flags win).

With no file, ``default_config()`` serves the packaged SmolLM2-135M-Instruct as
``smollm2-135m-instruct`` (the default) and Gemma 3 270M as ``gemma-3-270m``.
Validation errors name the bad field and value.

One module per part of the file: ``models`` (``[[models]]``, ``[[groups]]``), ``server``,
``tenants`` (``[[tenants]]``, ``[quota]``), ``execution`` (``[workers]``, ``[batching]``,
``[engine]``, ``[scheduling]``, ``[constraints]``), ``cluster``; ``file`` holds ``Config``, the
whole file; ``load`` reads one and ``defaults`` is the one served with no file. This module
is the public API: every name above is imported from here.
"""

from sluice.config.cluster import ClusterConfig
from sluice.config.defaults import (
    DEFAULT_KV_CELLS_PER_SEQ,
    DEFAULT_RETAINED_SLOTS,
    DEFAULT_SEQ_SLOTS,
    DEFAULT_TPOT_TARGET_MS,
    DEFAULT_TTFT_TARGET_MS,
    default_config,
    packaged_model,
)
from sluice.config.execution import (
    BatchingConfig,
    ConstraintsConfig,
    EngineSection,
    SchedulingConfig,
    WorkersConfig,
)
from sluice.config.file import Config
from sluice.config.load import (
    SECRET_FIELD_WORDS,
    describe_errors,
    load_config,
    with_overrides,
)
from sluice.config.models import (
    EMBEDDING_SUFFIX,
    RERANK_SUFFIX,
    EmbeddingsConfig,
    FaultsConfig,
    GroupConfig,
    ModelConfig,
    ReasoningConfig,
    SamplingConfig,
)
from sluice.config.server import ServerConfig
from sluice.config.tenants import (
    QuotaConfig,
    TenantConfig,
    TenantLimits,
    hash_key,
)

__all__ = [
    "DEFAULT_KV_CELLS_PER_SEQ",
    "DEFAULT_RETAINED_SLOTS",
    "DEFAULT_SEQ_SLOTS",
    "DEFAULT_TPOT_TARGET_MS",
    "DEFAULT_TTFT_TARGET_MS",
    "EMBEDDING_SUFFIX",
    "RERANK_SUFFIX",
    "SECRET_FIELD_WORDS",
    "BatchingConfig",
    "ClusterConfig",
    "Config",
    "ConstraintsConfig",
    "EmbeddingsConfig",
    "EngineSection",
    "FaultsConfig",
    "GroupConfig",
    "ModelConfig",
    "QuotaConfig",
    "ReasoningConfig",
    "SamplingConfig",
    "SchedulingConfig",
    "ServerConfig",
    "TenantConfig",
    "TenantLimits",
    "WorkersConfig",
    "default_config",
    "describe_errors",
    "hash_key",
    "load_config",
    "packaged_model",
    "with_overrides",
]
