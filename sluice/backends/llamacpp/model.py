"""A GGUF language model with a multi-sequence llama.cpp context, driven one
``forward`` at a time by the continuous-batching engine.

One loaded model is one ``llama_model`` plus one ``llama_context`` with ``n_seq_max``
sequences; the engine's sequence slots are llama.cpp sequence ids. With ``kv_unified``
the KV cache is one pool of ``n_ctx`` cells that any sequence may fill (so a slot costs
nothing and concurrency follows the free cells); otherwise each sequence owns its own
``n_ctx / n_seq_max`` cells (llama.cpp rounds that up to a multiple of 256). One
``forward`` is one ``llama_decode`` (several if the tokens exceed ``n_batch``), with the
batch arrays owned by numpy so that filling a batch costs a few vectorised writes instead
of a Python loop over tokens.

Greedy decoding is deterministic for a given batch composition, but llama.cpp does not
promise bit-identical logits for the same sequence in a different batch.
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sluice.backends.base import (
    BackendError,
    ForwardChunk,
    GenerativeModel,
    ModelLoadError,
    ModelSpec,
)
from sluice.backends.llamacpp.native import NumpyBatch, free_native, load_llama_model
from sluice.backends.llamacpp.options import LlamaCppOptions
from sluice.backends.llamacpp.tokenizer import LlamaCppTokenizer


class LlamaCppGenerative(LlamaCppTokenizer, GenerativeModel):
    """A GGUF model with a multi-sequence context, driven by ``forward``.

    Invariants: slot ``s`` is llama.cpp sequence id ``s`` and holds ``slot_len[s]``
    tokens at positions ``0 .. slot_len[s]-1``; a chunk must start at its slot's length
    and end within ``n_ctx_per_seq``. If a decode fails, every slot the forward touched
    is released (its KV may be partly written) and ``BackendError`` is raised; the
    engine fails those sequences. Not thread-safe: one worker thread drives it.
    """

    def __init__(self, lib: Any, spec: ModelSpec, options: LlamaCppOptions) -> None:
        self.n_batch = options.n_batch
        self._ctx: Any = None
        self._model: Any
        self._model, self.path = load_llama_model(lib, spec, options, vocab_only=False)
        try:
            super().__init__(lib, spec, options, self._model, standalone=False)
            params = lib.llama_context_default_params()
            params.n_ctx = options.n_ctx
            params.n_seq_max = options.n_seq_max
            params.n_batch = params.n_ubatch = options.n_batch
            params.n_threads = params.n_threads_batch = options.n_threads
            params.kv_unified = options.kv_unified
            # A full-size sliding-window cache keeps every position, so copy_sequence can
            # share any prefix and release_sequence can trim; the cells are the same
            # n_ctx either way, so this costs little.
            params.swa_full = True
            self._ctx = lib.llama_init_from_model(self._model, params)
            if not self._ctx:
                raise ModelLoadError(
                    f"{spec.model_id}: llama.cpp could not create a context with "
                    f"n_ctx={params.n_ctx}, n_seq_max={self.n_seq_max} (out of memory?)"
                )
        except BaseException:
            free_native(lib, self._ctx, self._model)
            raise
        self._finalizer = weakref.finalize(self, free_native, lib, self._ctx, self._model)
        self._mem = lib.llama_get_memory(self._ctx)
        self.n_ctx_total = int(lib.llama_n_ctx(self._ctx))
        self.n_ctx_per_seq = int(lib.llama_n_ctx_seq(self._ctx))
        self.kv_unified = options.kv_unified
        self.slot_len = [0] * self.n_seq_max
        self._batch = NumpyBatch(lib, self.n_batch)

    def _check_open(self) -> None:
        if not self._finalizer.alive:
            raise BackendError(f"{self.spec.model_id}: model is closed")

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.n_seq_max:
            raise BackendError(f"slot {slot} is outside 0..{self.n_seq_max - 1}")

    def forward(self, chunks: Sequence[ForwardChunk]) -> np.ndarray:
        self._check_open()
        n_wanted = 0
        planned = dict.fromkeys((c.seq_slot for c in chunks), 0)
        for slot in planned:
            self._check_slot(slot)
            planned[slot] = self.slot_len[slot]
        for c in chunks:
            if not c.tokens:
                raise BackendError(f"slot {c.seq_slot}: empty chunk")
            if min(c.tokens) < 0 or max(c.tokens) >= self.vocab_size:
                raise BackendError(f"slot {c.seq_slot}: token id outside the vocabulary")
            if c.start_pos != planned[c.seq_slot]:
                raise BackendError(
                    f"slot {c.seq_slot} holds {planned[c.seq_slot]} tokens, "
                    f"chunk starts at {c.start_pos}"
                )
            end = c.start_pos + len(c.tokens)
            if end > self.n_ctx_per_seq:
                raise BackendError(
                    f"slot {c.seq_slot} overflows its {self.n_ctx_per_seq} tokens (needs {end})"
                )
            planned[c.seq_slot] = end
            n_wanted += c.n_rows
        # llama.cpp (non-unified KV) splits a batch whose sequence ids are not ascending
        # into one micro-batch per sequence: measured 3.5x slower at batch 8. Feed the
        # chunks in slot order and hand the logits rows back in the caller's order.
        order = sorted(range(len(chunks)), key=lambda i: chunks[i].seq_slot)
        in_order = order == list(range(len(chunks)))
        fed = chunks if in_order else [chunks[i] for i in order]
        # Every token in one decode (every decode step): the rows are llama.cpp's own
        # logits buffer, not a copy (at batch 8 of Gemma's 262k vocabulary a copy is 8 MB
        # a step; at 32, 34 MB of fresh pages). Else one array gathers the decodes' rows.
        one_decode = sum(len(c.tokens) for c in chunks) <= self.n_batch
        out = None if one_decode else np.empty((n_wanted, self.vocab_size), dtype=np.float32)
        try:
            logits = self._run(fed, out)
        except BaseException:
            for slot in planned:
                self._release(slot)
            raise
        for slot, length in planned.items():
            self.slot_len[slot] = length
        if in_order:
            return logits
        # ``out`` holds each chunk's rows in slot order; gather them in the caller's order
        start_in_out = {}
        row = 0
        for i in order:
            start_in_out[i] = row
            row += chunks[i].n_rows
        rows = [start_in_out[i] + k for i in range(len(chunks)) for k in range(chunks[i].n_rows)]
        return logits[rows]

    def _run(self, chunks: Sequence[ForwardChunk], out: np.ndarray | None) -> np.ndarray:
        """Fill the batch chunk by chunk, decoding whenever it is full; rows in order, into
        ``out``, or (``out`` None: the tokens fit one decode) as a view of llama.cpp's
        logits buffer."""
        b = self._batch
        fill = 0
        row = 0
        pending_rows: list[int] = []  # batch indices flagged for output, in order
        for c in chunks:
            tokens = np.asarray(c.tokens, dtype=np.int32)
            done = 0
            while done < len(tokens):
                if fill == b.capacity:  # only with ``out``: more tokens than one decode
                    assert out is not None
                    row = self._decode_into(fill, pending_rows, out, row)
                    fill, pending_rows = 0, []
                take = min(len(tokens) - done, b.capacity - fill)
                span = slice(fill, fill + take)
                b.token[span] = tokens[done : done + take]
                start = c.start_pos + done
                b.pos[span] = np.arange(start, start + take, dtype=np.int32)
                b.seq[span] = c.seq_slot
                done += take
                fill += take
                if c.all_logits:
                    b.logits[span] = 1
                    pending_rows.extend(range(span.start, span.stop))
                else:
                    b.logits[span] = 0
                    if done == len(tokens) and c.want_logits:
                        b.logits[fill - 1] = 1
                        pending_rows.append(fill - 1)
        if out is None:
            if fill:
                self._decode(fill)
            return self._logits(len(pending_rows))
        if fill:
            row = self._decode_into(fill, pending_rows, out, row)
        return out

    def _decode(self, fill: int) -> None:
        self._batch.struct.n_tokens = fill
        rc = self._lib.llama_decode(self._ctx, self._batch.struct)
        if rc != 0:
            raise BackendError(f"{self.spec.model_id}: llama_decode failed with code {rc}")

    def _decode_into(self, fill: int, pending_rows: list[int], out: np.ndarray,
                     row: int) -> int:
        self._decode(fill)
        n = len(pending_rows)
        if n:
            out[row : row + n] = self._logits(n)
        return row + n

    def _logits(self, n: int) -> np.ndarray:
        """The last decode's ``n`` output rows, in batch order: a view of llama.cpp's
        buffer, valid until the next decode. One call for every row, not one per
        sequence: each ctypes call hands the GIL away, and getting it back from a busy
        event loop can cost a switch interval per call (measured: the step time grew ~10
        ms per sequence with the HTTP streams running)."""
        if n == 0:
            return np.empty((0, self.vocab_size), dtype=np.float32)
        ptr = self._lib.llama_get_logits(self._ctx)
        if not ptr:
            raise BackendError(f"{self.spec.model_id}: no logits after decode")
        return np.ctypeslib.as_array(ptr, shape=(n, self.vocab_size))

    def _release(self, slot: int) -> None:
        self._lib.llama_memory_seq_rm(self._mem, slot, -1, -1)
        self.slot_len[slot] = 0

    def release_sequence(self, seq_slot: int) -> None:
        self._check_open()
        self._check_slot(seq_slot)
        self._release(seq_slot)

    def trim_sequence(self, seq_slot: int, n_tokens: int) -> None:
        self._check_open()
        self._check_slot(seq_slot)
        if not 0 <= n_tokens <= self.slot_len[seq_slot]:
            raise BackendError(
                f"slot {seq_slot} holds {self.slot_len[seq_slot]} tokens, cannot keep {n_tokens}"
            )
        if n_tokens < self.slot_len[seq_slot] and not self._lib.llama_memory_seq_rm(
            self._mem, seq_slot, n_tokens, -1
        ):
            self._release(seq_slot)
            raise BackendError(f"could not trim slot {seq_slot} to {n_tokens} tokens")
        self.slot_len[seq_slot] = n_tokens

    def copy_sequence(self, src_slot: int, dst_slot: int, n_tokens: int) -> None:
        self._check_open()
        self._check_slot(src_slot)
        self._check_slot(dst_slot)
        if src_slot == dst_slot:
            raise BackendError(f"cannot copy slot {src_slot} onto itself")
        if not 0 <= n_tokens <= self.slot_len[src_slot]:
            raise BackendError(
                f"slot {src_slot} holds {self.slot_len[src_slot]} tokens, cannot copy {n_tokens}"
            )
        lib = self._lib
        self._release(dst_slot)
        if n_tokens == 0:
            return
        if self.kv_unified:  # one stream: the copy shares the cells of [0, n_tokens)
            lib.llama_memory_seq_cp(self._mem, src_slot, dst_slot, 0, n_tokens)
            self.slot_len[dst_slot] = n_tokens
            return
        # Each sequence has its own KV stream, and llama.cpp copies across streams only
        # whole (a partial range fails a GGML_ASSERT and aborts the whole process), so
        # copy all and trim the tail.
        lib.llama_memory_seq_cp(self._mem, src_slot, dst_slot, -1, -1)
        if n_tokens < self.slot_len[src_slot] and not lib.llama_memory_seq_rm(
            self._mem, dst_slot, n_tokens, -1
        ):
            self._release(dst_slot)
            raise BackendError(f"could not trim slot {dst_slot} to {n_tokens} tokens")
        self.slot_len[dst_slot] = n_tokens

    def save_sequence(self, seq_slot: int, path: Path, tokens: Sequence[int]) -> int:
        self._check_open()
        self._check_slot(seq_slot)
        if len(tokens) != self.slot_len[seq_slot]:
            raise BackendError(f"slot {seq_slot} holds {self.slot_len[seq_slot]} tokens, "
                               f"not {len(tokens)}")
        ids = (ctypes.c_int32 * len(tokens))(*tokens)
        written = self._lib.llama_state_seq_save_file(self._ctx, str(path).encode(), seq_slot,
                                                      ids, len(tokens))
        if not written:
            raise BackendError(f"could not write slot {seq_slot} to {path.name}")
        return int(written)

    def sequence_state(self, seq_slot: int) -> bytes:
        self._check_open()
        self._check_slot(seq_slot)
        size = int(self._lib.llama_state_seq_get_size(self._ctx, seq_slot))
        buf = (ctypes.c_uint8 * size)()
        if size == 0 or self._lib.llama_state_seq_get_data(self._ctx, buf, size,
                                                           seq_slot) != size:
            raise BackendError(f"could not read slot {seq_slot}'s KV")
        return bytes(buf)

    def set_sequence_state(self, seq_slot: int, state: bytes, n_tokens: int) -> None:
        self._check_open()
        self._check_slot(seq_slot)
        self._release(seq_slot)
        if not 0 < n_tokens <= self.n_ctx_per_seq:
            raise BackendError(f"a slot holds 1 to {self.n_ctx_per_seq} tokens, not {n_tokens}")
        src = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        if self._lib.llama_state_seq_set_data(self._ctx, src, len(state), seq_slot) == 0:
            self._release(seq_slot)
            raise BackendError(f"could not restore {n_tokens} tokens of KV into slot "
                               f"{seq_slot}")
        self.slot_len[seq_slot] = n_tokens

    def load_sequence(self, seq_slot: int, path: Path) -> tuple[list[int], int]:
        self._check_open()
        self._check_slot(seq_slot)
        self._release(seq_slot)
        capacity = self.n_ctx_per_seq
        ids = (ctypes.c_int32 * capacity)()
        count = ctypes.c_size_t(0)
        read = self._lib.llama_state_seq_load_file(self._ctx, str(path).encode(), seq_slot,
                                                   ids, capacity, ctypes.byref(count))
        tokens = list(ids[: count.value])
        if not read or (tokens and not 0 <= min(tokens) <= max(tokens) < self.vocab_size):
            self._release(seq_slot)
            raise BackendError(f"{path.name} is not a saved sequence of this model that fits "
                               f"a slot of {capacity} tokens")
        self.slot_len[seq_slot] = len(tokens)
        return tokens, int(read)
