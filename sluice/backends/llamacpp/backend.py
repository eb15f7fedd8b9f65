"""The ``llamacpp`` backend: builds ``LlamaCppGenerative`` models, one-shot
``LlamaCppEmbedder``s (``task = "embedding"`` or ``"rerank"``) and vocab-only
``LlamaCppTokenizer``s from specs."""

from __future__ import annotations

from sluice.backends.base import ModelLoadError, ModelSpec
from sluice.backends.llamacpp.embedder import LlamaCppEmbedder
from sluice.backends.llamacpp.model import LlamaCppGenerative
from sluice.backends.llamacpp.native import free_native, init_llama, load_llama_model
from sluice.backends.llamacpp.options import LlamaCppOptions
from sluice.backends.llamacpp.tokenizer import LlamaCppTokenizer


class LlamaCppBackend:
    """Loads GGUF models into ``LlamaCppGenerative`` (generative), ``LlamaCppEmbedder``
    (one-shot embedding or rerank) and vocab-only ``LlamaCppTokenizer``s."""

    name = "llamacpp"

    def load(self, spec: ModelSpec) -> LlamaCppGenerative | LlamaCppEmbedder:
        options = LlamaCppOptions.from_spec(spec)
        if spec.kind == "oneshot" and spec.task in ("embedding", "rerank"):
            return LlamaCppEmbedder(init_llama(options.verbose), spec, options)
        if spec.kind != "generative":
            raise ModelLoadError(f"{spec.model_id}: the llamacpp backend serves generative "
                                 f"embedding and rerank models, not {spec.task}")
        return LlamaCppGenerative(init_llama(options.verbose), spec, options)

    def load_tokenizer(self, spec: ModelSpec) -> LlamaCppTokenizer:
        options = LlamaCppOptions.from_spec(spec)
        lib = init_llama(options.verbose)
        model, _ = load_llama_model(lib, spec, options, vocab_only=True)
        try:
            return LlamaCppTokenizer(lib, spec, options, model)
        except BaseException:
            free_native(lib, None, model)
            raise
