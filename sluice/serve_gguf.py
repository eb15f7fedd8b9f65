"""``sluice serve PATH.gguf`` and ``sluice serve DIR``: a configuration made from model files
and llama-server's flag names, so that serving a GGUF needs no TOML.

Each file (or every GGUF in a folder, in name order) becomes a generative llamacpp model
named by its ``--alias`` (llama-server) or ``--served-model-name`` (vLLM), else by the file's
name; its ``memory_bytes`` is worked out from the file (``backends.llamacpp.sizing``). Models
load on first request under the workers' memory budget (the least recently used idle one is
evicted to make room); ``--keep-alive`` unloads one after that long idle (a folder's models:
Ollama's 5 minutes unless given), ``--pin NAME`` keeps one loaded for good. The llama.cpp
flags (``--ctx-size``, ``--parallel``, ``--threads``, ``--batch-size``, ``--n-gpu-layers``,
``--chat-template``) apply to every llamacpp model, those of a config file included;
``--api-key`` requires that key (it belongs to the tenant ``default``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice.config import Config

FOLDER_KEEP_ALIVE = "5m"
"""The keep-alive of models served from a folder when ``--keep-alive`` is not given
(Ollama's default)."""
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
    keep_alive: str | None = None
    """Every model's idle time before unloading (Ollama's forms)."""
    pins: tuple[str, ...] = ()
    """Model ids never unloaded nor evicted."""

    def options(self) -> dict[str, Any]:
        """The llamacpp options these flags set (``--ctx-size 0`` is resolved per file)."""
        pairs = (("n_ctx", self.ctx_size), ("n_seq_max", self.parallel),
                 ("n_threads", self.threads), ("n_batch", self.batch_size),
                 ("n_gpu_layers", self.n_gpu_layers), ("chat_template", self.chat_template))
        return {k: v for k, v in pairs if v is not None}


def model_files(paths: Sequence[Path]) -> list[Path]:
    """``paths`` with each folder replaced by the GGUF model files in it, in name order
    (multimodal projectors ``mmproj*`` and the second and later parts of a split model are
    not models of their own). ``ValueError`` names a missing path or a folder without one."""
    out: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.glob("*.gguf") if p.is_file()
                           and not p.name.lower().startswith("mmproj")
                           and not _LATER_SPLIT.search(p.name))
            if not found:
                raise ValueError(f"no GGUF model files in folder {path}")
            out.extend(found)
        elif path.is_file():
            out.append(path)
        else:
            raise ValueError(f"model file not found: {path}")
    return out


_LATER_SPLIT = re.compile(r"-(?!0+1-)\d+-of-\d+\.gguf$", re.IGNORECASE)


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
    folder = any(f.is_dir() for f in files)
    files = model_files(files)
    if len(flags.aliases) > (len(files) or 1):
        raise ValueError(f"{len(flags.aliases)} aliases for {len(files) or 1} model(s)")
    if files:
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
    keep_alive = flags.keep_alive or (FOLDER_KEEP_ALIVE if folder else None)
    model_ids = {m["id"] for m in data["models"]}
    unknown = [p for p in flags.pins if p not in model_ids]
    if unknown:
        raise ValueError(f"--pin {unknown[0]}: no such model (models: {sorted(model_ids)})")
    for m in data["models"]:
        if keep_alive is not None:
            m["keep_alive"] = keep_alive
        if m["id"] in flags.pins:
            m["pinned"] = True
    if flags.api_keys:
        tenants = data["tenants"]
        default = next((t for t in tenants if t["id"] == "default"), None)
        if default is None:
            tenants.append({"id": "default", "api_keys": list(flags.api_keys)})
        else:
            default["api_keys"] = [*default["api_keys"], *flags.api_keys]
    return Config.model_validate(data)
