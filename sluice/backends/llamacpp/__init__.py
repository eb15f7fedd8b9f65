"""GGUF language models through llama.cpp's low-level C API (llama-cpp-python).

Spec options (see ``LlamaCppOptions``): ``path`` (a file, or ``packaged:<id>``; absent =
the packaged default), ``n_ctx`` (4096), ``n_seq_max`` (8), ``n_threads`` (2),
``n_batch`` (512), ``chat_template`` (the GGUF's own; none = a completion model),
``verbose``, ``extra_bufts``, ``kv_unified``, ``pooling`` (one-shot embedding models).

Modules: ``options`` (validated spec options, the GGUF path, the KV layout), ``native``
(ctypes initialisation and log silencing, model load/free, the numpy-owned
``llama_batch``), ``templates`` (which chat template a GGUF uses: Jinja, llama.cpp's
built-in renderer, Gemma's turn format from ``sluice.backends.chat``, or none), ``tokenizer``
(``LlamaCppTokenizer``), ``model`` (``LlamaCppGenerative``: the multi-sequence context and
``forward``), ``embedder`` (``LlamaCppEmbedder``: a one-shot model of pooled, normalised
embeddings), ``backend`` (``LlamaCppBackend``).
"""

from sluice.backends.chat import render_gemma
from sluice.backends.llamacpp.backend import LlamaCppBackend
from sluice.backends.llamacpp.embedder import LlamaCppEmbedder
from sluice.backends.llamacpp.model import LlamaCppGenerative
from sluice.backends.llamacpp.options import LlamaCppOptions, ctx_layout, resolve_model_path
from sluice.backends.llamacpp.tokenizer import LlamaCppTokenizer

__all__ = [
    "LlamaCppBackend",
    "LlamaCppEmbedder",
    "LlamaCppGenerative",
    "LlamaCppOptions",
    "LlamaCppTokenizer",
    "ctx_layout",
    "render_gemma",
    "resolve_model_path",
]
