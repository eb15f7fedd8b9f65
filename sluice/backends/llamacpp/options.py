"""The llamacpp settings of a ``ModelSpec``: validated options, the GGUF file they
name, and how llama.cpp lays out its KV cache over the sequences (one pool, or one
stream per sequence)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from sluice.backends.base import ModelLoadError, ModelSpec
from sluice.backends.packaged import (
    DEFAULT_MODEL_ID,
    PACKAGED_MODELS,
    PACKAGED_PREFIX,
    packaged_gguf_path,
)

POOLING_TYPES = ("mean", "cls", "last", "rank")
"""The poolings a one-shot GGUF may name (llama.cpp's ``LLAMA_POOLING_TYPE_*``): ``rank``
scores (query, document) pairs with the file's classifier head (a rerank model)."""
KV_CELL_ALIGN = 256
"""llama.cpp rounds each sequence's KV cells up to a multiple of this."""


def resolve_model_path(spec: ModelSpec, options: LlamaCppOptions | None = None) -> Path:
    """The GGUF file a spec names: ``packaged:<id>`` (or a bare packaged id) is that
    packaged model, an absent ``path`` the packaged default."""
    raw = (options or LlamaCppOptions.from_spec(spec)).path or DEFAULT_MODEL_ID
    name = raw.removeprefix(PACKAGED_PREFIX)
    if name in PACKAGED_MODELS:
        try:
            return packaged_gguf_path(name)
        except (ImportError, OSError, ValueError) as exc:
            raise ModelLoadError(
                f"{spec.model_id}: the packaged model {name!r} is unavailable: {exc}"
            ) from exc
    if raw.startswith(PACKAGED_PREFIX):
        known = ", ".join(PACKAGED_PREFIX + m for m in PACKAGED_MODELS)
        raise ModelLoadError(f"{spec.model_id}: unknown packaged model {raw!r} "
                             f"(known: {known})")
    return Path(raw).expanduser()


@dataclass(frozen=True)
class LlamaCppOptions:
    """The llamacpp settings of a ``ModelSpec``, validated before anything is loaded."""

    path: str | None = None
    """A GGUF file, or ``packaged:<id>`` for a packaged model (``packaged:gemma-3-270m``);
    ``None`` = the packaged default, ``packaged:smollm2-135m-instruct``."""
    n_ctx: int = 4096
    """Total KV cells: one pool that any sequence may fill (``kv_unified``), or split
    evenly over the sequences (llama.cpp rounds up to 256 each)."""
    n_seq_max: int = 8
    """Sequence slots, i.e. the most sequences decoding at once. With a unified pool a
    slot costs no memory, so this is a ceiling; how many run at once follows the free KV
    and the engine's step budget."""
    kv_unified: bool = False
    """One KV pool shared by every sequence (llama.cpp's ``kv_unified``) instead of a
    fixed ``n_ctx / n_seq_max`` stream per sequence."""
    n_threads: int = 2
    """CPU threads per decode."""
    n_batch: int = 512
    """The most tokens in one ``llama_decode``; a larger forward is split."""
    chat_template: str | None = None
    """Jinja template text (rendered as llama-server does), ``gemma``, or a llama.cpp
    built-in template name (``chatml``, ``llama3`` ...); ``None`` = the GGUF's own
    (``tokenizer.chat_template``), and a GGUF without one is a completion model: chat
    requests to it are refused (``model_has_no_chat_template``)."""
    n_gpu_layers: int | None = None
    """Layers to offload to a GPU (llama-server's ``--n-gpu-layers``; a CPU build of
    llama.cpp ignores it); ``None`` = llama.cpp's default."""
    verbose: bool = False
    """Keep llama.cpp's log output (process-wide, decided by the first load)."""
    extra_bufts: bool | None = None
    """Let llama.cpp repack weights into extra CPU buffer types (AMX, AVX); ``None`` =
    yes unless the CPU has AMX, where llama.cpp 0.3.36's AMX matmul segfaults."""
    pooling: str | None = None
    """One-shot models: ``mean``, ``cls`` or ``last`` (how an input's token states become
    one vector), or ``rank`` (a rerank model's score); ``None`` = the file's own
    (``<arch>.pooling_type``), else mean."""

    @classmethod
    def from_spec(cls, spec: ModelSpec) -> LlamaCppOptions:
        """Read and check ``spec.options``; ``ModelLoadError`` names a bad or unknown
        field."""
        opts = spec.options
        unknown = sorted(set(opts) - OPTION_KEYS)
        if unknown:
            names = ", ".join(repr(k) for k in unknown)
            raise ModelLoadError(f"{spec.model_id}: unknown llamacpp option {names} "
                                 f"(known: {', '.join(sorted(OPTION_KEYS))})")
        ints = {}
        for key in ("n_ctx", "n_seq_max", "n_threads", "n_batch"):
            value = opts.get(key, getattr(cls, key))
            try:
                number = 0 if isinstance(value, bool | float) else int(value)
            except (TypeError, ValueError):
                number = 0
            if number <= 0:
                raise ModelLoadError(
                    f"{spec.model_id}: option {key}={value!r} must be a positive integer"
                )
            ints[key] = number
        path = opts.get("path")
        template = opts.get("chat_template")
        extra = opts.get("extra_bufts")
        gpu = opts.get("n_gpu_layers")
        pooling = opts.get("pooling")
        if pooling is not None and pooling not in POOLING_TYPES:
            raise ModelLoadError(f"{spec.model_id}: option pooling={pooling!r} must be one of "
                                 f"{', '.join(POOLING_TYPES)}")
        if gpu is not None and (isinstance(gpu, bool) or not isinstance(gpu, int) or gpu < -1):
            raise ModelLoadError(
                f"{spec.model_id}: option n_gpu_layers={gpu!r} must be an integer >= -1")
        return cls(
            path=None if path is None else str(path),
            chat_template=None if not template else str(template),
            n_gpu_layers=gpu,
            verbose=bool(opts.get("verbose", False)),
            extra_bufts=None if extra is None else bool(extra),
            kv_unified=bool(opts.get("kv_unified", cls.kv_unified)),
            pooling=pooling,
            **ints,
        )

    def use_extra_bufts(self) -> bool:
        return (not _cpu_has_amx()) if self.extra_bufts is None else self.extra_bufts


OPTION_KEYS = frozenset({"path", "n_ctx", "n_seq_max", "n_threads", "n_batch", "chat_template",
                         "n_gpu_layers", "verbose", "extra_bufts", "kv_unified", "pooling"})
"""Every option the llamacpp backend reads (any other key is an error naming it)."""


def ctx_layout(n_ctx: int, n_seq_max: int, unified: bool = False) -> tuple[int, int]:
    """``(n_ctx_total, n_ctx_per_seq)`` as llama.cpp lays out the KV cache: a unified pool
    is one stream that any sequence may fill, else one stream per sequence."""
    if unified:
        total = -(-n_ctx // KV_CELL_ALIGN) * KV_CELL_ALIGN
        return total, total
    per_seq = -(-n_ctx // n_seq_max)
    per_seq = -(-per_seq // KV_CELL_ALIGN) * KV_CELL_ALIGN
    return per_seq * n_seq_max, per_seq


@functools.cache
def _cpu_has_amx() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return "amx_int8" in line.split()
    except OSError:
        pass
    return False
