"""llama.cpp's C API through llama-cpp-python's ctypes bindings: process-wide
initialisation (with its logs silenced), loading and freeing a ``llama_model``, and a
``llama_batch`` whose arrays numpy owns.

Everything that touches the C library directly lives here or in the classes that hold a
``lib`` handle (the tokenizer and the generative model); ``lib`` is passed in, never
imported, so a test can wrap it.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Any

import numpy as np

from sluice.backends.base import ModelLoadError, ModelSpec
from sluice.backends.llamacpp.options import LlamaCppOptions, resolve_model_path

_llama: Any
try:
    import llama_cpp as _llama
except ImportError:  # pragma: no cover - exercised only without the ``llm`` extra
    _llama = None

_INIT_LOCK = threading.Lock()
_initialised = False
_quiet_log_callback: Any = None
"""The no-op log callback; held here so ctypes never frees it while llama.cpp may call it."""


def _require_llama() -> Any:
    if _llama is None:
        raise ModelLoadError(
            "llama-cpp-python is not installed; install sluice with the 'llm' extra"
        )
    return _llama


def _no_log(level: int, text: bytes, user_data: Any) -> None:
    """Drop one llama.cpp log line."""


def init_llama(verbose: bool) -> Any:
    """Initialise llama.cpp once per process and, unless ``verbose``, silence its logs."""
    global _initialised, _quiet_log_callback
    lib = _require_llama()
    with _INIT_LOCK:
        if not _initialised:
            if not verbose:
                _quiet_log_callback = lib.llama_log_callback(_no_log)
                lib.llama_log_set(_quiet_log_callback, ctypes.c_void_p(0))
            lib.llama_backend_init()
            _initialised = True
    return lib


def load_llama_model(
    lib: Any, spec: ModelSpec, options: LlamaCppOptions, *, vocab_only: bool
) -> tuple[Any, Path]:
    """Load the spec's GGUF (only its vocabulary when ``vocab_only``): ``(model, path)``.
    ``ModelLoadError`` names the file when it is missing or llama.cpp refuses it."""
    path = resolve_model_path(spec, options)
    if not path.is_file():
        raise ModelLoadError(f"{spec.model_id}: GGUF file not found: {path}")
    params = lib.llama_model_default_params()
    params.vocab_only = vocab_only
    params.use_extra_bufts = options.use_extra_bufts()
    if options.n_gpu_layers is not None:
        params.n_gpu_layers = options.n_gpu_layers
    model = lib.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise ModelLoadError(
            f"{spec.model_id}: llama.cpp could not load {path} (not a GGUF file, truncated, "
            "or an unsupported architecture)"
        )
    return model, path


def tokenize(lib: Any, vocab: Any, text: str, *, add_bos: bool, special: bool) -> list[int]:
    """``text``'s token ids (``add_bos``: with the vocabulary's leading special tokens;
    ``special``: special-token text such as ``<|im_end|>`` becomes that token)."""
    data = text.encode("utf-8")
    capacity = len(data) + 2
    while True:
        buf = (ctypes.c_int32 * capacity)()
        n = lib.llama_tokenize(vocab, data, len(data), buf, capacity, add_bos, special)
        if n >= 0:
            return buf[:n]
        capacity = -n


def free_native(lib: Any, ctx: Any, model: Any) -> None:
    """Free a context and a model, either of which may be null."""
    if ctx:
        lib.llama_free(ctx)
    if model:
        lib.llama_model_free(model)


class NumpyBatch:
    """A ``llama_batch`` whose arrays numpy owns: filled by slices, freed by the GC."""

    def __init__(self, lib: Any, capacity: int) -> None:
        self.capacity = capacity
        self.token = np.zeros(capacity, dtype=np.int32)
        self.pos = np.zeros(capacity, dtype=np.int32)
        self.n_seq_id = np.ones(capacity, dtype=np.int32)
        self.seq = np.zeros(capacity, dtype=np.int32)
        self.logits = np.zeros(capacity, dtype=np.int8)
        # seq_id is int32** (a list of ids per token); each token has exactly one id, so
        # token i's list is &seq[i].
        self._seq_ptrs = (ctypes.POINTER(ctypes.c_int32) * capacity)()
        base = self.seq.ctypes.data
        for i in range(capacity):
            self._seq_ptrs[i] = ctypes.cast(base + 4 * i, ctypes.POINTER(ctypes.c_int32))
        self.struct = lib.llama_batch()
        self.struct.token = self.token.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        self.struct.embd = ctypes.POINTER(ctypes.c_float)()
        self.struct.pos = self.pos.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        self.struct.n_seq_id = self.n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        self.struct.seq_id = self._seq_ptrs
        self.struct.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
