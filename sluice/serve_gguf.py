"""``sluice serve PATH.gguf``: a configuration made from model files and llama-server's
flag names, so that serving a GGUF needs no TOML.

Each file becomes a generative llamacpp model named by its ``--alias`` (llama-server) or
``--served-model-name`` (vLLM), else by the file's name; its ``memory_bytes`` is worked out
from the file (``backends.llamacpp.sizing``). The llama.cpp flags (``--ctx-size``,
``--parallel``, ``--threads``, ``--batch-size``, ``--n-gpu-layers``, ``--chat-template``)
apply to every llamacpp model, those of a config file included; ``--api-key`` requires that
key (it belongs to the tenant ``default``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice.config import Config

DEFAULT_CTX_SIZE = 8192
"""``--ctx-size`` when neither the flag nor a config gives one (``0`` = the model's
trained context, as in llama-server)."""
_ID_BAD = re.compile(r"[^A-Za-z0-9._:-]+")


@dataclass(frozen=True)
class LlamaFlags:
    """llama-server's flags, as given (``None`` = not given)."""

    ctx_size: int | None = None
    parallel: int | None = None
    threads: int | None = None
    batch_size: int | None = None
    n_gpu_layers: int | None = None
    chat_template: str | None = None
    api_keys: tuple[str, ...] = ()
    aliases: tuple[str, ...] = field(default=())

    def options(self) -> dict[str, Any]:
        """The llamacpp options these flags set (``--ctx-size 0`` is resolved per file)."""
        pairs = (("n_ctx", self.ctx_size), ("n_seq_max", self.parallel),
                 ("n_threads", self.threads), ("n_batch", self.batch_size),
                 ("n_gpu_layers", self.n_gpu_layers), ("chat_template", self.chat_template))
        return {k: v for k, v in pairs if v is not None}


def model_id_for(path: Path) -> str:
    """A model id from a file name: ``gemma-3-270m-q4_k_m.gguf`` → ``gemma-3-270m-q4_k_m``."""
    name = _ID_BAD.sub("-", path.stem).strip("-._:") or "model"
    return name[:128]


def gguf_model(path: Path, model_id: str, options: dict[str, Any]) -> dict[str, Any]:
    """One ``[[models]]`` entry for a GGUF file, ``memory_bytes`` worked out from it."""
    from sluice.backends.llamacpp.sizing import estimate_memory_bytes, gguf_shape

    shape = gguf_shape(path)
    opts = {"n_ctx": DEFAULT_CTX_SIZE, **options, "path": str(path)}
    if opts["n_ctx"] == 0:
        opts["n_ctx"] = shape["n_ctx_train"] or DEFAULT_CTX_SIZE
    return {"id": model_id, "kind": "generative", "backend": "llamacpp", "task": "generation",
            "memory_bytes": estimate_memory_bytes(path, int(opts["n_ctx"]), shape),
            "load_cost_s": 1.0, "options": opts}


def _resize(model: dict[str, Any], options: dict[str, Any]) -> None:
    """Apply llama.cpp flags to a configured model; its ``memory_bytes`` grows to what its
    file needs with the new context, if that is more."""
    from sluice.backends.llamacpp.options import LlamaCppOptions, resolve_model_path
    from sluice.backends.llamacpp.sizing import estimate_memory_bytes, gguf_shape
    from sluice.config import ModelConfig

    opts = {**model["options"], **options}
    spec = ModelConfig.model_validate({**model, "options": {**opts, "n_ctx": 1}}).spec()
    path = resolve_model_path(spec, LlamaCppOptions.from_spec(spec))
    shape = gguf_shape(path)
    if opts.get("n_ctx") == 0:
        opts["n_ctx"] = shape["n_ctx_train"] or DEFAULT_CTX_SIZE
    n_ctx = int(opts.get("n_ctx", LlamaCppOptions.n_ctx))
    model["options"] = opts
    model["memory_bytes"] = max(model["memory_bytes"], estimate_memory_bytes(path, n_ctx, shape))


def apply_llama_flags(config: Config, files: Sequence[Path], flags: LlamaFlags) -> Config:
    """``config`` with its models replaced by ``files`` (when any are given), the llama.cpp
    flags applied to every llamacpp model, and ``--api-key`` required. ``ValueError`` names
    a missing file or more aliases than files."""
    data = config.model_dump()
    options = flags.options()
    if len(flags.aliases) > (len(files) or 1):
        raise ValueError(f"{len(flags.aliases)} aliases for {len(files) or 1} model(s)")
    if files:
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise ValueError(f"model file not found: {missing[0]}")
        ids = [flags.aliases[i] if i < len(flags.aliases) else model_id_for(f)
               for i, f in enumerate(files)]
        data["models"] = [gguf_model(f, i, options) for f, i in zip(files, ids, strict=True)]
        data["server"]["default_model"] = None
        data["groups"] = []
        largest = max(m["memory_bytes"] for m in data["models"])
        workers = data["workers"]
        workers["budget_bytes"] = max(workers["budget_bytes"], largest)
    else:
        for m in data["models"]:
            if m["backend"] == "llamacpp" and options:
                _resize(m, options)
        if flags.aliases:
            old = data["server"]["default_model"] or data["models"][0]["id"]
            for m in data["models"]:
                if m["id"] == old:
                    m["id"] = flags.aliases[0]
            data["server"]["default_model"] = flags.aliases[0]
    if flags.api_keys:
        tenants = data["tenants"]
        default = next((t for t in tenants if t["id"] == "default"), None)
        if default is None:
            tenants.append({"id": "default", "api_keys": list(flags.api_keys)})
        else:
            default["api_keys"] = [*default["api_keys"], *flags.api_keys]
    return Config.model_validate(data)
