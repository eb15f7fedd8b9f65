"""The server binary that llama.cpp's server test suite starts (``LLAMA_SERVER_BIN_PATH``),
for ``bench/peer_suite.py``: ``python -m bench.lib.peer_wrapper llama|sluice ARGS`` takes the
suite's llama-server command line and ``exec``s the named server on the packaged model
instead, so the suite's ``terminate()`` reaches the server itself.

Model (the same for both servers; no hub is reachable, so the suite's Hugging Face models are
replaced by the packaged GGUFs, ``$PEER_SMOLLM2`` and ``$PEER_GEMMA``):

- ``--hf-repo`` / ``-hf`` / ``--hf-file`` / ``--model-url`` become ``-m FILE`` by the suite's
  preset: the chat and tool presets (``tinyllama2`` = ``test-model-stories260K``, the
  default ``stories260K.gguf``, its split ``stories15M`` and ``stories15M_MOE``) get
  SmolLM2-135M-Instruct, which has a chat template; every other repository (the embedding,
  infill, rerank and vision presets, and the slow tests' models) gets Gemma 3 270M.
- no model at all (the suite's ``router`` preset) becomes a folder holding both packaged
  GGUFs (``$PEER_MODELS_DIR``): ``--models-dir`` for llama-server, ``sluice serve DIR``.
- ``--offline`` is dropped (nothing is downloaded).

Both servers: ``--threads 2`` (over the suite's), and ``--no-repack`` on CPUs with AMX
(llama.cpp's AMX repacked matmul crashes this build; sluice sets it itself).

llama-server gets every other flag as the suite gave it.

sluice gets ``sluice serve`` with the flags it shares with llama-server passed as given
(``--host`` (comma-separated), ``--port``, ``--temp``, ``--seed``, ``--alias``, ``--tags``,
``--ctx-size``, ``--parallel``, ``--batch-size``, ``--n-predict``, ``--embedding``,
``--pooling``, ``--api-key``, ``--slots`` / ``--no-slots``, ``--slot-save-path``,
``--cors-origins``, ``--no-ui``, ``--chat-template``, ``--chat-template-file``, ``--jinja``,
``--metrics``, ``--cont-batching``, ``--kv-unified``, ``--n-gpu-layers``, ``--verbose``,
``--reasoning``, ``--reasoning-budget``, ``--reasoning-format`` (``none`` and
``deepseek-legacy`` refused by name), and ``--context-shift``, which sluice refuses by
name), and maps:

- ``--sleep-idle-seconds N`` to ``--keep-alive Ns`` (sluice's idle unload);
- ``--models-dir DIR`` to ``sluice serve DIR``;

and adds ``--unknown-model default``: llama-server serves its one model whatever name a
request gives (the suite sends ``gpt-3.5-turbo``, ``codellama70b``, ...), which sluice does
with that setting (its default refuses an unknown name with 404).

It drops, for sluice, the flags that only tune llama.cpp's kernels or llama-server's own
parts: ``--no-jinja`` (sluice renders every template as Jinja), ``--ubatch-size``, ``-fa``,
``-ctk`` / ``-ctv``, ``--swa-full``, ``--no-cache-idle-slots``,
``--models-max``, ``--no-models-autoload`` and ``--backend_sampling`` (where llama.cpp
samples: on its compute backend, a kernel placement). Any flag not named here reaches
``sluice serve`` as given, which refuses it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

CHAT_REPOS = ("ggml-org/test-model-stories260K", "tinyllamas/", "ggml-org/stories15M_MOE")
"""``--hf-repo`` / ``--hf-file`` values (prefixes) of the suite's chat and tool presets:
served with SmolLM2, every other repository with Gemma 3 270M."""

_MODEL_FLAGS = {"--hf-repo", "-hf", "-hfr", "--hf-file", "-hff", "--model-url", "-mu"}
_SLUICE_DROP_VALUED = {"--ubatch-size", "-ub", "-fa", "--flash-attn", "-ctk",
                       "--cache-type-k", "-ctv", "--cache-type-v", "--models-max"}
_SLUICE_DROP = {"--no-jinja", "--swa-full", "--no-cache-idle-slots",
                "--no-models-autoload", "--offline",
                "--backend_sampling", "--backend-sampling"}
_THREADS = {"--threads", "-t", "--threads-batch", "-tb"}


def _pick_model(values: Sequence[str]) -> str:
    """The packaged GGUF for the suite's model flags' values."""
    chat = any(v.startswith(prefix) for v in values for prefix in CHAT_REPOS)
    return os.environ["PEER_SMOLLM2" if chat else "PEER_GEMMA"]


def _split(args: Sequence[str]) -> tuple[list[str], list[str], bool]:
    """``args`` less the model and thread flags: the rest, the model flags' values, and
    whether a local model (``-m``) was given."""
    rest: list[str] = []
    model_values: list[str] = []
    local = False
    i = 0
    while i < len(args):
        a = args[i]
        if a in _MODEL_FLAGS:
            model_values.append(args[i + 1])
            i += 2
            continue
        if a in _THREADS:
            i += 2
            continue
        if a == "--offline":
            i += 1
            continue
        if a in ("-m", "--model"):
            local = True
        rest.append(a)
        i += 1
    return rest, model_values, local


def _amx() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return " amx" in f.read()
    except OSError:
        return False


def llama_argv(binary: str, args: Sequence[str]) -> list[str]:
    """llama-server's command line for the suite's ``args``."""
    rest, model_values, local = _split(args)
    if model_values:
        model = ["-m", _pick_model(model_values)]
    elif local or "--models-dir" in rest:
        model = []
    else:
        model = ["--models-dir", os.environ["PEER_MODELS_DIR"]]
    return [binary, *model, *rest, "--threads", "2", "--threads-batch", "2",
            *(["--no-repack"] if _amx() else [])]


def sluice_argv(python: str, args: Sequence[str]) -> list[str]:
    """``sluice serve``'s command line for the suite's llama-server ``args``."""
    rest, model_values, local = _split(args)
    out: list[str] = []
    folder: str | None = None
    i = 0
    while i < len(rest):
        a = rest[i]
        if a in _SLUICE_DROP:
            i += 1
        elif a in _SLUICE_DROP_VALUED:
            i += 2
        elif a == "--sleep-idle-seconds":
            out += ["--keep-alive", f"{rest[i + 1]}s"]
            i += 2
        elif a == "--models-dir":
            folder = rest[i + 1]
            i += 2
        else:
            out.append(a)
            i += 1
    if model_values:
        model = ["-m", _pick_model(model_values)]
    elif local:
        model = []
    else:
        model = [folder or os.environ["PEER_MODELS_DIR"]]
    return [python, "-m", "sluice.cli", "serve", *model, *out, "--threads", "2",
            "--unknown-model", "default"]


def main(argv: Sequence[str]) -> None:
    """``exec`` the server ``argv[0]`` names with the suite's ``argv[1:]`` mapped."""
    which, args = argv[0], argv[1:]
    if which == "llama":
        cmd = llama_argv(os.environ["PEER_LLAMA_SERVER"], args)
    elif which == "sluice":
        cmd = sluice_argv(sys.executable, args)
    else:
        raise SystemExit(f"peer_wrapper: llama or sluice, not {which!r}")
    print("peer_wrapper:", " ".join(cmd), file=sys.stderr, flush=True)
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
