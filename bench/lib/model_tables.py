"""The server configs the benchmarks serve, as TOML text: one definition of the packaged
Gemma 3 270M on llama.cpp and one of the synthetic chat model, so every bench that says
"the real model" or "the synthetic model" means the same thing, and the one-worker server
tables most of them put in front. A model table goes after the ``[server]``/``[workers]``/
``[engine]`` tables; a ``[models.faults]`` table may follow it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

GEMMA = "gemma-3-270m"
PACKAGED_GEMMA = "packaged:gemma-3-270m"
SYNTH_CHAT = "synth-chat"


def server_tables(model: str, queue: int, inbox: int, budget_bytes: int | None = None) -> str:
    """``[server]`` (``model`` the default), ``[scheduling]`` (a queue of ``queue``) and
    ``[workers]``: one worker with an inbox of ``inbox`` (and ``budget_bytes`` of memory,
    else the default)."""
    budget = "" if budget_bytes is None else f"budget_bytes = {budget_bytes:_}\n"
    return f"""
[server]
default_model = "{model}"
[scheduling]
queue_capacity = {queue}
[workers]
count = 1
{budget}inbox_capacity = {inbox}
"""


def gemma_table(path: str = PACKAGED_GEMMA, *, n_ctx: int = 8192, n_seq_max: int = 8,
                n_threads: int = 2, extra: str = "") -> str:
    """Gemma 3 270M (``path``: a GGUF file or ``packaged:...``) as ``gemma-3-270m``, chat
    in Gemma's turn format (its GGUF has no template); ``extra`` is more TOML lines of the
    model's own (``tpot_target_ms = ...``)."""
    return llm_table(GEMMA, path, n_ctx=n_ctx, n_seq_max=n_seq_max, n_threads=n_threads,
                     extra=extra, chat_template="gemma")


def llm_table(model: str, path: str, *, n_ctx: int = 8192, n_seq_max: int = 8,
              n_threads: int = 2, extra: str = "", chat_template: str | None = None) -> str:
    """A GGUF model (``path``) on llama.cpp as ``model``: ``n_seq_max`` slots sharing
    ``n_ctx`` cells, ``n_threads`` threads; ``chat_template`` for a file without one."""
    template = "" if chat_template is None else f', chat_template = "{chat_template}"'
    return f"""
[[models]]
id = "{model}"
kind = "generative"
backend = "llamacpp"
task = "generation"
memory_bytes = 600_000_000
{extra}
options = {{ path = "{path}", n_ctx = {n_ctx}, n_seq_max = {n_seq_max}, \
n_threads = {n_threads}{template} }}
"""


def _smollm2_gguf() -> Path:
    from sluice.backends.packaged import smollm2_gguf_path

    return smollm2_gguf_path()


def _gemma_gguf() -> Path:
    from sluice.backends.packaged import gemma_gguf_path

    return gemma_gguf_path(progress=False)


BENCH_MODELS: dict[str, tuple[str, Callable[[], Path]]] = {
    GEMMA: ("Gemma 3 270M Q4_K_M", _gemma_gguf),
    "smollm2-135m-instruct": ("SmolLM2-135M-Instruct Q4_1", _smollm2_gguf),
}
"""The packaged models the LLM benchmarks can run, by id: a label and where its GGUF is.
Gemma 3 270M is the reference every committed LLM result was measured on."""


def synthetic_chat_table(*, load_s: float = 0.0, step_fixed_s: float = 0.02,
                         decode_per_seq_s: float = 0.0005,
                         prefill_per_token_s: float = 0.0001, byte_tokens: bool = False) -> str:
    """The synthetic backend as ``synth-chat``: 8 sequence slots of 512 tokens; a step
    costs ``step_fixed_s`` + ``decode_per_seq_s`` a decoding sequence +
    ``prefill_per_token_s`` a prompt token (by default 20 ms a step: slow enough that the
    load generator is not the bottleneck). ``byte_tokens``: a byte vocabulary, which can
    follow a grammar (structured output decodes)."""
    return f"""
[[models]]
id = "{SYNTH_CHAT}"
kind = "generative"
backend = "synthetic"
task = "generation"
memory_bytes = 100_000_000
[models.options]
load_s = {load_s}
n_seq_max = 8
n_ctx_per_seq = 512
step_fixed_s = {step_fixed_s}
decode_per_seq_s = {decode_per_seq_s}
prefill_per_token_s = {prefill_per_token_s}
""" + ("byte_tokens = true\nvocab_size = 300\n" if byte_tokens else "")


def synthetic_toml(queue: int = 16, inbox: int = 8) -> str:
    """One worker, 8 sequence slots, 20 ms a decode step: about 25 requests/s of 16
    tokens, slow enough that the load generator is not the bottleneck."""
    return server_tables(SYNTH_CHAT, queue, inbox) + synthetic_chat_table()


def llm_toml(queue: int = 16, inbox: int = 8) -> str:
    from sluice.backends.packaged import gemma_gguf_path

    gguf = gemma_gguf_path(progress=False)
    return (server_tables(GEMMA, queue, inbox, budget_bytes=4_000_000_000)
            + gemma_table(str(gguf)))
