"""Embeddings from a GGUF: a one-shot model over its own llama.cpp context with embeddings
on (llama-server's ``--embedding``), one L2-normalised vector per input; or, with
``pooling = "rank"`` (llama-server's ``--reranking``), a rerank model: one score per
(query, document) pair, read from the file's classifier head over the pair's tokens laid
out as llama-server lays them (the file's ``rerank`` template, else BOS, query, EOS, SEP,
document, EOS as its vocabulary adds them). A file without a classifier head scores by the
first value of its pooled state, as llama-server does: a ranking only a real reranker GGUF
makes meaningful.

The context has one KV pool (``kv_unified``) of ``n_ctx`` cells, which is also its batch
(``n_batch = n_ubatch = n_ctx``), so every input is pooled from a single forward pass, as a
non-causal encoder needs. A batch of inputs is packed into as few ``llama_decode`` calls as
the pool and ``n_seq_max`` allow, one sequence id per input; the KV is cleared before each.
An input is a text or an ``EmbedInput`` (token ids and texts in order). One longer than
``n_ctx`` tokens fails alone with ``InputError`` ``context_length_exceeded`` (OpenAI's and
llama-server's answer), unless it asks to be cut to its first ``n_ctx`` (``truncate``:
Ollama's default); one holding a token id outside the vocabulary fails alone with
``invalid_request_error``. An empty one embeds the vocabulary's leading special tokens, or
the end-of-text token when it has none.
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from sluice.backends.base import (
    BackendError,
    Embedding,
    EmbedInput,
    InputError,
    ModelLoadError,
    ModelSpec,
    RerankPair,
    RerankScore,
    embed_input,
    rerank_pairs,
    run_valid,
)
from sluice.backends.llamacpp.native import NumpyBatch, free_native, load_llama_model, tokenize
from sluice.backends.llamacpp.options import LlamaCppOptions


def file_pooling(lib: Any, model: Any) -> str | None:
    """The pooling the GGUF names (``<arch>.pooling_type``) when it is one of
    ``options.POOLING_TYPES``; else ``None``."""
    buf = ctypes.create_string_buffer(64)
    if lib.llama_model_meta_val_str(model, b"general.architecture", buf, len(buf)) < 0:
        return None
    key = f"{buf.value.decode()}.pooling_type".encode()
    if lib.llama_model_meta_val_str(model, key, buf, len(buf)) < 0:
        return None
    codes = {lib.LLAMA_POOLING_TYPE_MEAN: "mean", lib.LLAMA_POOLING_TYPE_CLS: "cls",
             lib.LLAMA_POOLING_TYPE_LAST: "last", lib.LLAMA_POOLING_TYPE_RANK: "rank"}
    try:
        return codes.get(int(buf.value.decode()))
    except ValueError:
        return None


class LlamaCppEmbedder:
    """A GGUF that embeds: ``run_batch`` maps texts to ``Embedding``s, unit vectors of
    ``n_embd`` floats with the count of ``tokens`` each was pooled from; with ``rank``
    pooling, ``RerankPair``s to ``RerankScore``s (the head's first output, unnormalised).

    Invariants: every returned vector has ``n_embd`` entries and L2 norm 1 (a zero vector
    stays zero); the same text gives the same vector whatever batch it runs in, up to
    llama.cpp's floating-point differences between batch shapes. Not thread-safe: one
    worker thread drives it."""

    def __init__(self, lib: Any, spec: ModelSpec, options: LlamaCppOptions) -> None:
        self.spec = spec
        self._lib = lib
        self._ctx: Any = None
        self._model: Any
        self._model, self.path = load_llama_model(lib, spec, options, vocab_only=False)
        try:
            self.pooling = options.pooling or file_pooling(lib, self._model) or "mean"
            params = lib.llama_context_default_params()
            params.n_ctx = params.n_batch = params.n_ubatch = options.n_ctx
            params.n_seq_max = options.n_seq_max
            params.n_threads = params.n_threads_batch = options.n_threads
            params.embeddings = True
            params.kv_unified = True
            params.pooling_type = getattr(lib, f"LLAMA_POOLING_TYPE_{self.pooling.upper()}")
            self._ctx = lib.llama_init_from_model(self._model, params)
            if not self._ctx:
                raise ModelLoadError(f"{spec.model_id}: llama.cpp could not create an "
                                     f"embedding context with n_ctx={options.n_ctx}")
        except BaseException:
            free_native(lib, self._ctx, self._model)
            raise
        self._finalizer = weakref.finalize(self, free_native, lib, self._ctx, self._model)
        self._mem = lib.llama_get_memory(self._ctx)
        self._vocab = lib.llama_model_get_vocab(self._model)
        self.n_ctx = int(lib.llama_n_ctx(self._ctx))
        self.n_seq_max = options.n_seq_max
        self.n_embd = int(lib.llama_model_n_embd_out(self._model))
        self.n_cls_out = max(1, int(lib.llama_model_n_cls_out(self._model)))
        self.n_vocab = int(lib.llama_vocab_n_tokens(self._vocab))
        eos = int(lib.llama_vocab_eos(self._vocab))
        self._empty = (eos if eos >= 0 else 0,)
        """What an input that tokenizes to nothing is embedded (or scored) from."""
        self._rerank_template: bytes | None = lib.llama_model_chat_template(self._model,
                                                                             b"rerank")
        self._batch = NumpyBatch(lib, self.n_ctx)

    def close(self) -> None:
        """Free the context and the model. Idempotent."""
        self._finalizer()

    def tokens(self, x: str | EmbedInput) -> list[int] | InputError:
        """The ids an input is embedded from (BOS added, special-token text parsed, as
        llama-server does; never empty), or why it cannot be: a token id outside the
        vocabulary, or more than ``n_ctx`` tokens when it does not ask to be cut."""
        item = embed_input(x)
        ids: list[int] = []
        for piece in item.pieces:
            if isinstance(piece, str):
                ids += tokenize(self._lib, self._vocab, piece, add_bos=not ids, special=True)
            elif 0 <= piece < self.n_vocab:
                ids.append(piece)
            else:
                return InputError("invalid_request_error", f"token id {piece} is outside "
                                                           f"the vocabulary [0, {self.n_vocab})")
        ids = ids or list(self._empty)
        if len(ids) > self.n_ctx and not item.truncate:
            return InputError("context_length_exceeded",
                              f"input ({len(ids)} tokens) is too large to process: the "
                              f"model's context holds {self.n_ctx} tokens")
        return ids[: self.n_ctx]

    def pair_tokens(self, pair: RerankPair) -> tuple[list[int], int] | InputError:
        """A rerank pair's ids as llama-server lays them out, and how many of them are the
        query's; or ``context_length_exceeded`` past ``n_ctx``."""
        lib, vocab = self._lib, self._vocab
        query = tokenize(lib, vocab, pair.query, add_bos=False, special=False)
        if self._rerank_template:
            text = (self._rerank_template.decode("utf-8", "replace")
                    .replace("{query}", pair.query).replace("{document}", pair.document))
            ids = tokenize(lib, vocab, text, add_bos=False, special=True)
        else:
            eos = int(lib.llama_vocab_eos(vocab))
            if eos == lib.LLAMA_TOKEN_NULL:
                eos = int(lib.llama_vocab_sep(vocab))
            bos = [int(lib.llama_vocab_bos(vocab))] if lib.llama_vocab_get_add_bos(vocab) else []
            end = [eos] if lib.llama_vocab_get_add_eos(vocab) else []
            sep = [int(lib.llama_vocab_sep(vocab))] if lib.llama_vocab_get_add_sep(vocab) else []
            document = tokenize(lib, vocab, pair.document, add_bos=False, special=False)
            ids = [*bos, *query, *end, *sep, *document, *end]
        ids = ids or list(self._empty)
        if len(ids) > self.n_ctx:
            return InputError("context_length_exceeded",
                              f"query and document ({len(ids)} tokens) are too large to "
                              f"process: the model's context holds {self.n_ctx} tokens")
        return ids, min(len(query), len(ids))

    def run_batch(self, inputs: Sequence[Any]) -> list[Any]:
        if not self._finalizer.alive:
            raise BackendError(f"{self.spec.model_id}: model is closed")
        if self.pooling == "rank":
            return self._scores(rerank_pairs(inputs))
        return run_valid([self.tokens(x) for x in inputs], self._embeddings)

    def _embeddings(self, seqs: list[list[int]]) -> list[Embedding]:
        return [Embedding(_unit(v), len(ids))
                for v, ids in zip(self._pooled(seqs), seqs, strict=True)]

    def _scores(self, pairs: Sequence[RerankPair]) -> list[RerankScore | InputError]:
        def scored(laid_out: list[tuple[list[int], int]]) -> list[RerankScore]:
            pooled = self._pooled([ids for ids, _ in laid_out])
            return [RerankScore(float(v[0]), n_query, len(ids) - n_query)
                    for v, (ids, n_query) in zip(pooled, laid_out, strict=True)]
        return run_valid([self.pair_tokens(p) for p in pairs], scored)

    def _pooled(self, seqs: Sequence[list[int]]) -> list[np.ndarray]:
        """The pooled output of each of ``seqs``, in as few ``llama_decode`` calls as the
        pool and ``n_seq_max`` allow."""
        out: list[np.ndarray] = []
        start = 0
        while start < len(seqs):
            end, used = start, 0
            while (end < len(seqs) and end - start < self.n_seq_max
                   and used + len(seqs[end]) <= self.n_ctx):
                used += len(seqs[end])
                end += 1
            out += self._embed(seqs[start:end])
            start = end
        return out

    def _embed(self, seqs: Sequence[list[int]]) -> list[np.ndarray]:
        """One ``llama_decode`` over ``seqs`` (sequence ids 0..), pooled per sequence."""
        lib, b = self._lib, self._batch
        lib.llama_memory_clear(self._mem, True)
        fill = 0
        for seq_id, ids in enumerate(seqs):
            span = slice(fill, fill + len(ids))
            b.token[span] = ids
            b.pos[span] = np.arange(len(ids), dtype=np.int32)
            b.seq[span] = seq_id
            b.logits[span] = 1
            fill += len(ids)
        b.struct.n_tokens = fill
        rc = lib.llama_decode(self._ctx, b.struct)
        if rc != 0:
            raise BackendError(f"{self.spec.model_id}: llama_decode failed with code {rc}")
        width = self.n_cls_out if self.pooling == "rank" else self.n_embd
        vectors = []
        for seq_id in range(len(seqs)):
            ptr = lib.llama_get_embeddings_seq(self._ctx, seq_id)
            if not ptr:
                raise BackendError(f"{self.spec.model_id}: no pooled output for a sequence")
            vectors.append(np.ctypeslib.as_array(ptr, shape=(width,)).astype(np.float64))
        return vectors


def _unit(vec: np.ndarray) -> list[float]:
    """``vec`` L2-normalised (a zero vector stays zero)."""
    norm = float(np.linalg.norm(vec))
    unit: list[float] = (vec / norm if norm > 0 else vec).tolist()
    return unit
