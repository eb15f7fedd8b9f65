"""GGUF language models through llama.cpp's low-level C API (llama-cpp-python).

One loaded model is one ``llama_model`` plus one ``llama_context`` with ``n_seq_max``
sequences; the engine's sequence slots are llama.cpp sequence ids. The KV cache is not
unified, so each sequence owns its own ``n_ctx / n_seq_max`` cells (llama.cpp rounds
that up to a multiple of 256). One ``forward`` is one ``llama_decode`` (several if the
tokens exceed ``n_batch``), with the batch arrays owned by numpy so that filling a
batch costs a few vectorised writes instead of a Python loop over tokens.

Spec options (see ``LlamaCppOptions``): ``path`` (absent or ``packaged:gemma-3-270m`` =
the packaged default), ``n_ctx`` (4096), ``n_seq_max`` (8), ``n_threads`` (2),
``n_batch`` (512), ``chat_template`` (the GGUF's own, else ``gemma``), ``verbose``,
``extra_bufts``.

Greedy decoding is deterministic for a given batch composition, but llama.cpp does not
promise bit-identical logits for the same sequence in a different batch.
"""

from __future__ import annotations

import ctypes
import functools
import threading
import weakref
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
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
from sluice.backends.packaged import DEFAULT_MODEL_ID, PACKAGED_PREFIX, default_gguf_path

_llama: Any
try:
    import llama_cpp as _llama
except ImportError:  # pragma: no cover - exercised only without the ``llm`` extra
    _llama = None

KV_CELL_ALIGN = 256
"""llama.cpp rounds each sequence's KV cells up to a multiple of this."""
GEMMA_TEMPLATE = "gemma"

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


def _init_llama(verbose: bool) -> Any:
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


def resolve_model_path(spec: ModelSpec, options: LlamaCppOptions | None = None) -> Path:
    """The GGUF file a spec names; the packaged default when ``path`` is absent."""
    raw = (options or LlamaCppOptions.from_spec(spec)).path
    if raw is None or raw in (PACKAGED_PREFIX + DEFAULT_MODEL_ID, DEFAULT_MODEL_ID):
        try:
            return default_gguf_path()
        except (ImportError, OSError, ValueError) as exc:
            raise ModelLoadError(
                f"{spec.model_id}: the packaged model {DEFAULT_MODEL_ID!r} is unavailable: {exc}"
            ) from exc
    if raw.startswith(PACKAGED_PREFIX):
        raise ModelLoadError(f"{spec.model_id}: unknown packaged model {raw!r}")
    return Path(raw).expanduser()


@dataclass(frozen=True)
class LlamaCppOptions:
    """The llamacpp settings of a ``ModelSpec``, validated before anything is loaded."""

    path: str | None = None
    """A GGUF file; ``None`` or ``packaged:gemma-3-270m`` = the packaged default model."""
    n_ctx: int = 4096
    """Total KV cells, split evenly over the sequences (llama.cpp rounds up to 256 each)."""
    n_seq_max: int = 8
    """Sequence slots, i.e. the most sequences decoding at once."""
    n_threads: int = 2
    """CPU threads per decode."""
    n_batch: int = 512
    """The most tokens in one ``llama_decode``; a larger forward is split."""
    chat_template: str | None = None
    """``gemma``, a llama.cpp built-in template name or text; ``None`` = the GGUF's own,
    else ``gemma``."""
    verbose: bool = False
    """Keep llama.cpp's log output (process-wide, decided by the first load)."""
    extra_bufts: bool | None = None
    """Let llama.cpp repack weights into extra CPU buffer types (AMX, AVX); ``None`` =
    yes unless the CPU has AMX, where llama.cpp 0.3.36's AMX matmul segfaults."""

    @classmethod
    def from_spec(cls, spec: ModelSpec) -> LlamaCppOptions:
        """Read and check ``spec.options``; ``ModelLoadError`` names a bad field."""
        opts = spec.options
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
        return cls(
            path=None if path is None else str(path),
            chat_template=None if not template else str(template),
            verbose=bool(opts.get("verbose", False)),
            extra_bufts=None if extra is None else bool(extra),
            **ints,
        )

    def use_extra_bufts(self) -> bool:
        return (not _cpu_has_amx()) if self.extra_bufts is None else self.extra_bufts


def ctx_layout(n_ctx: int, n_seq_max: int) -> tuple[int, int]:
    """``(n_ctx_total, n_ctx_per_seq)`` as llama.cpp lays out a non-unified KV cache."""
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


def _load_llama_model(
    lib: Any, spec: ModelSpec, options: LlamaCppOptions, *, vocab_only: bool
) -> tuple[Any, Path]:
    path = resolve_model_path(spec, options)
    if not path.is_file():
        raise ModelLoadError(f"{spec.model_id}: GGUF file not found: {path}")
    params = lib.llama_model_default_params()
    params.vocab_only = vocab_only
    params.use_extra_bufts = options.use_extra_bufts()
    model = lib.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise ModelLoadError(
            f"{spec.model_id}: llama.cpp could not load {path} (not a GGUF file, truncated, "
            "or an unsupported architecture)"
        )
    return model, path


def _free_native(lib: Any, ctx: Any, model: Any) -> None:
    if ctx:
        lib.llama_free(ctx)
    if model:
        lib.llama_model_free(model)


def render_gemma(messages: Sequence[Mapping[str, str]]) -> str:
    """Gemma's turn format; system text is prepended to the next user turn, no BOS."""
    parts: list[str] = []
    system: list[str] = []
    for message in messages:
        role, content = message["role"], message["content"].strip()
        if role == "system":
            system.append(content)
            continue
        role = "model" if role == "assistant" else role
        if system and role != "model":
            content = "\n\n".join([*system, content])
            system = []
        parts.append(f"<start_of_turn>{role}\n{content}<end_of_turn>\n")
    if system:  # a conversation of system messages only
        parts.append(f"<start_of_turn>user\n{chr(10).join(system)}<end_of_turn>\n")
    parts.append("<start_of_turn>model\n")
    return "".join(parts)


class LlamaCppTokenizer:
    """Tokenizer and chat template of a GGUF, over any loaded ``llama_model``.

    Built by ``LlamaCppBackend.load_tokenizer`` on a vocab-only model (no weights), so it
    is cheap and independent of the worker's context; a lock serialises its calls so
    several control-plane threads may share it. ``tokenize`` parses special-token text
    such as ``<start_of_turn>`` into its special token, as chat templates need.
    """

    def __init__(
        self,
        lib: Any,
        spec: ModelSpec,
        options: LlamaCppOptions,
        model: Any,
        *,
        standalone: bool = True,
    ) -> None:
        """Wrap ``model``; a ``standalone`` tokenizer owns it (frees it on ``close``) and
        locks its calls, while a model's own tokenizer is driven by its worker thread."""
        self.spec = spec
        self.options = options
        self._lib = lib
        self._vocab = lib.llama_model_get_vocab(model)
        self._lock: AbstractContextManager[Any] = threading.Lock() if standalone else nullcontext()
        self.vocab_size = int(lib.llama_vocab_n_tokens(self._vocab))
        self.n_seq_max = options.n_seq_max
        self.n_ctx_total, self.n_ctx_per_seq = ctx_layout(options.n_ctx, options.n_seq_max)
        self.eos_token_ids = frozenset(
            t for t in range(self.vocab_size) if lib.llama_vocab_is_eog(self._vocab, t)
        )
        self._pieces: dict[int, bytes] = {}
        self.chat_template = self._pick_template(model)
        try:
            self.render_chat([{"role": "user", "content": "hi"}])
        except ValueError as exc:
            raise ModelLoadError(f"{spec.model_id}: {exc}") from exc
        if standalone:
            self._finalizer = weakref.finalize(self, _free_native, lib, None, model)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        """Free the native model. Idempotent."""
        self._finalizer()

    def _pick_template(self, model: Any) -> str:
        if self.options.chat_template:
            return self.options.chat_template
        embedded = self._lib.llama_model_chat_template(model, None)
        return embedded.decode("utf-8", "replace") if embedded else GEMMA_TEMPLATE

    def tokenize(self, text: str, *, add_bos: bool) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 2
        while True:
            buf = (ctypes.c_int32 * capacity)()
            with self._lock:
                n = self._lib.llama_tokenize(
                    self._vocab, data, len(data), buf, capacity, add_bos, True
                )
            if n >= 0:
                return buf[:n]
            capacity = -n

    def token_bytes(self, token_id: int) -> bytes:
        piece = self._pieces.get(token_id)
        if piece is None:
            if not 0 <= token_id < self.vocab_size:
                raise ValueError(f"token id {token_id} is outside the vocabulary")
            piece = self._piece(token_id)
            self._pieces[token_id] = piece
        return piece

    def _piece(self, token_id: int) -> bytes:
        size = 32
        while True:
            buf = ctypes.create_string_buffer(size)
            # special=False: control tokens (BOS, EOS, <end_of_turn>) render as b"".
            with self._lock:
                n = self._lib.llama_token_to_piece(self._vocab, token_id, buf, size, 0, False)
            if n >= 0:
                return buf.raw[:n]
            size = -n

    def render_chat(self, messages: Sequence[Mapping[str, str]]) -> str:
        if self.chat_template == GEMMA_TEMPLATE:
            return render_gemma(messages)
        return self._render_builtin(messages)

    def _render_builtin(self, messages: Sequence[Mapping[str, str]]) -> str:
        """llama.cpp's built-in renderer: it recognises common templates by name or text."""
        lib = self._lib
        encoded = [(m["role"].encode(), m["content"].encode()) for m in messages]
        chat = (lib.llama_chat_message * len(encoded))()
        for i, (role, content) in enumerate(encoded):
            chat[i].role, chat[i].content = role, content
        template = self.chat_template.encode()
        size = 256 + sum(len(r) + len(c) for r, c in encoded) * 2
        for _ in range(2):
            buf = ctypes.create_string_buffer(size)
            n = lib.llama_chat_apply_template(template, chat, len(encoded), True, buf, size)
            if n < 0:
                raise ValueError(f"chat template {self.chat_template[:60]!r} is not supported")
            if n <= size:
                return buf.raw[:n].decode("utf-8", "replace")
            size = n
        raise ValueError("chat template output did not fit")  # pragma: no cover


class _NumpyBatch:
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
        self._model, self.path = _load_llama_model(lib, spec, options, vocab_only=False)
        try:
            super().__init__(lib, spec, options, self._model, standalone=False)
            params = lib.llama_context_default_params()
            params.n_ctx = options.n_ctx
            params.n_seq_max = options.n_seq_max
            params.n_batch = params.n_ubatch = options.n_batch
            params.n_threads = params.n_threads_batch = options.n_threads
            params.kv_unified = False
            # A full-size sliding-window cache keeps every position, so copy_sequence can
            # share any prefix and release_sequence can trim; with unified=False each
            # sequence's cells are n_ctx/n_seq_max anyway, so this costs little.
            params.swa_full = True
            self._ctx = lib.llama_init_from_model(self._model, params)
            if not self._ctx:
                raise ModelLoadError(
                    f"{spec.model_id}: llama.cpp could not create a context with "
                    f"n_ctx={params.n_ctx}, n_seq_max={self.n_seq_max} (out of memory?)"
                )
        except BaseException:
            _free_native(lib, self._ctx, self._model)
            raise
        self._finalizer = weakref.finalize(self, _free_native, lib, self._ctx, self._model)
        self._mem = lib.llama_get_memory(self._ctx)
        self.n_ctx_total = int(lib.llama_n_ctx(self._ctx))
        self.n_ctx_per_seq = int(lib.llama_n_ctx_seq(self._ctx))
        self.slot_len = [0] * self.n_seq_max
        self._batch = _NumpyBatch(lib, self.n_batch)

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
            n_wanted += c.want_logits
        # llama.cpp (non-unified KV) splits a batch whose sequence ids are not ascending
        # into one micro-batch per sequence: measured 3.5x slower at batch 8. Feed the
        # chunks in slot order and hand the logits rows back in the caller's order.
        order = sorted(range(len(chunks)), key=lambda i: chunks[i].seq_slot)
        in_order = order == list(range(len(chunks)))
        fed = chunks if in_order else [chunks[i] for i in order]
        out = np.empty((n_wanted, self.vocab_size), dtype=np.float32)
        try:
            self._run(fed, out)
        except BaseException:
            for slot in planned:
                self._release(slot)
            raise
        for slot, length in planned.items():
            self.slot_len[slot] = length
        if in_order:
            return out
        # row k of ``out`` belongs to the k-th wanted chunk in slot order
        wanted_sorted = [i for i in order if chunks[i].want_logits]
        row_of = {chunk_index: row for row, chunk_index in enumerate(wanted_sorted)}
        rows = [row_of[i] for i in range(len(chunks)) if chunks[i].want_logits]
        return out[rows]

    def _run(self, chunks: Sequence[ForwardChunk], out: np.ndarray) -> None:
        """Fill the batch chunk by chunk, decoding whenever it is full; rows in order."""
        b = self._batch
        fill = 0
        row = 0
        pending_rows: list[int] = []  # batch indices flagged for output, in order
        for c in chunks:
            tokens = np.asarray(c.tokens, dtype=np.int32)
            done = 0
            while done < len(tokens):
                if fill == b.capacity:
                    row = self._decode(fill, pending_rows, out, row)
                    fill, pending_rows = 0, []
                take = min(len(tokens) - done, b.capacity - fill)
                span = slice(fill, fill + take)
                b.token[span] = tokens[done : done + take]
                start = c.start_pos + done
                b.pos[span] = np.arange(start, start + take, dtype=np.int32)
                b.seq[span] = c.seq_slot
                b.logits[span] = 0
                done += take
                fill += take
                if done == len(tokens) and c.want_logits:
                    b.logits[fill - 1] = 1
                    pending_rows.append(fill - 1)
        if fill:
            row = self._decode(fill, pending_rows, out, row)

    def _decode(self, fill: int, pending_rows: list[int], out: np.ndarray, row: int) -> int:
        lib = self._lib
        self._batch.struct.n_tokens = fill
        rc = lib.llama_decode(self._ctx, self._batch.struct)
        if rc != 0:
            raise BackendError(f"{self.spec.model_id}: llama_decode failed with code {rc}")
        if not pending_rows:
            return row
        # One call for every output row (in batch order), not one per sequence: each
        # ctypes call hands the GIL away, and getting it back from a busy event loop can
        # cost a switch interval per call (measured: the step time grew ~10 ms per
        # sequence with the HTTP streams running).
        ptr = lib.llama_get_logits(self._ctx)
        if not ptr:
            raise BackendError(f"{self.spec.model_id}: no logits after decode")
        n = len(pending_rows)
        out[row : row + n] = np.ctypeslib.as_array(ptr, shape=(n, self.vocab_size))
        return row + n

    def _release(self, slot: int) -> None:
        self._lib.llama_memory_seq_rm(self._mem, slot, -1, -1)
        self.slot_len[slot] = 0

    def release_sequence(self, seq_slot: int) -> None:
        self._check_open()
        self._check_slot(seq_slot)
        self._release(seq_slot)

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


class LlamaCppBackend:
    """Loads GGUF models into ``LlamaCppGenerative`` and vocab-only ``LlamaCppTokenizer``s."""

    name = "llamacpp"

    def load(self, spec: ModelSpec) -> LlamaCppGenerative:
        if spec.kind != "generative":
            raise ModelLoadError(f"{spec.model_id}: the llamacpp backend serves generative models")
        options = LlamaCppOptions.from_spec(spec)
        return LlamaCppGenerative(_init_llama(options.verbose), spec, options)

    def load_tokenizer(self, spec: ModelSpec) -> LlamaCppTokenizer:
        options = LlamaCppOptions.from_spec(spec)
        lib = _init_llama(options.verbose)
        model, _ = _load_llama_model(lib, spec, options, vocab_only=True)
        try:
            return LlamaCppTokenizer(lib, spec, options, model)
        except BaseException:
            _free_native(lib, None, model)
            raise


__all__ = [
    "LlamaCppBackend",
    "LlamaCppGenerative",
    "LlamaCppOptions",
    "LlamaCppTokenizer",
    "ctx_layout",
    "render_gemma",
    "resolve_model_path",
]
