"""How much memory a GGUF model needs, worked out from the file, so that serving a file
needs no hand-written ``memory_bytes``."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

from sluice.backends.llamacpp.native import init_llama

OVERHEAD_RATIO = 0.25
"""Compute buffers and runtime state beyond the weights, as a share of the file: measured
on the packaged Gemma 3 270M (253 MB file, n_ctx 8192 over 8 sequences): 466 MB resident
after load and a prefill on every sequence, against 253 + 151 (KV) + 63 (this share)."""
KV_BYTES_PER_VALUE = 2
"""llama.cpp's default KV cache type is f16."""


def _meta_int(lib: Any, model: Any, key: str) -> int | None:
    buf = ctypes.create_string_buffer(64)
    if lib.llama_model_meta_val_str(model, key.encode(), buf, len(buf)) < 0:
        return None
    try:
        return int(buf.value.decode())
    except ValueError:
        return None


def gguf_shape(path: Path) -> dict[str, int]:
    """The numbers sizing needs from a GGUF's metadata (no weights are read): layers,
    KV heads, the K and V widths per head, and the trained context length. ``ValueError``
    if llama.cpp cannot read the file."""
    lib = init_llama(False)
    params = lib.llama_model_default_params()
    params.vocab_only = True
    model = lib.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise ValueError(f"llama.cpp could not read {path} (not a GGUF file, or truncated)")
    try:
        buf = ctypes.create_string_buffer(64)
        lib.llama_model_meta_val_str(model, b"general.architecture", buf, len(buf))
        arch = buf.value.decode()

        def meta(key: str) -> int | None:
            return _meta_int(lib, model, f"{arch}.{key}")

        # Metadata only: with vocab_only llama.cpp has not filled its per-layer hparams.
        n_head = meta("attention.head_count") or 1
        head_dim = (meta("embedding_length") or 0) // n_head
        n_layer = meta("block_count")
        if not n_layer or not head_dim:
            raise ValueError(f"{path}: no {arch}.block_count / embedding_length metadata")
        return {
            "n_layer": n_layer,
            "n_head_kv": meta("attention.head_count_kv") or n_head,
            "key_length": meta("attention.key_length") or head_dim,
            "value_length": meta("attention.value_length") or head_dim,
            "n_ctx_train": meta("context_length") or 0,
        }
    finally:
        lib.llama_model_free(model)


def kv_bytes(shape: dict[str, int], n_ctx: int) -> int:
    """The KV cache of ``n_ctx`` cells: per cell and layer, K and V of every KV head."""
    per_cell = shape["n_layer"] * shape["n_head_kv"] * (shape["key_length"]
                                                        + shape["value_length"])
    return n_ctx * per_cell * KV_BYTES_PER_VALUE


def estimate_memory_bytes(path: Path, n_ctx: int, shape: dict[str, int] | None = None) -> int:
    """Resident bytes of a GGUF served with ``n_ctx`` KV cells: the file, plus
    ``OVERHEAD_RATIO`` of it, plus the KV cache."""
    shape = shape or gguf_shape(path)
    size = path.stat().st_size
    return int(size * (1 + OVERHEAD_RATIO)) + kv_bytes(shape, n_ctx)
