"""``sluice serve PATH.gguf`` and ``sluice serve DIR``: a configuration made from model files
and llama-server's flag names, so that serving a GGUF needs no TOML.

Each file (or every GGUF in a folder, in name order) becomes a generative llamacpp model
named by its ``--alias`` (llama-server) or ``--served-model-name`` (vLLM), else by the file's
name; ``--alias a,b`` names it ``a`` with ``b`` as another name. Its ``memory_bytes`` is
worked out from the file (``backends.llamacpp.sizing``). Models load on first request under
the workers' memory budget (the least recently used idle one is evicted to make room);
``--keep-alive`` unloads one after that long idle (a folder's models: Ollama's 5 minutes
unless given), ``--pin NAME`` keeps one loaded for good. The llama.cpp flags
(``--ctx-size``, ``--parallel``, ``--threads``, ``--batch-size``, ``--n-gpu-layers``,
``--chat-template``, ``--no-repack``, ``--kv-unified``), the sampling defaults (``--temp``,
``--seed``: over the file's own recommendation, as in llama-server), ``--n-predict``,
``--embedding`` / ``--pooling`` and ``--reasoning`` / ``--reasoning-budget`` apply to every
generative llamacpp model, those of a config file included; ``--api-key`` requires that key
(it belongs to the tenant ``default``).
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
    """A llama.cpp template name, or template text (Jinja)."""
    no_repack: bool = False
    """Keep the weights as the file lays them out (llama.cpp's extra buffer types off)."""
    kv_unified: bool = False
    """One KV pool shared by every sequence."""
    temperature: float | None = None
    seed: int | None = None
    n_predict: int | None = None
    """A request's token limit when it names none (``-1``: until the context is full)."""
    embedding: bool = False
    """Every generative model also embeds (``[models.embeddings]``)."""
    pooling: str | None = None
    """``mean``, ``cls`` or ``last`` (``None``: the file's own, else mean); ``rank``: every
    generative model reranks instead (``--reranking``)."""
    api_keys: tuple[str, ...] = ()
    aliases: tuple[str, ...] = field(default=())
    """One per file in order; each may name more names after commas (``a,b``)."""
    keep_alive: str | None = None
    """Every model's idle time before unloading (Ollama's forms)."""
    reasoning: str | None = None
    """``on`` / ``off``: every model thinks (in ``<think>`` tags unless its config names
    others) by default, or not; ``auto`` or ``None``: each model's own default (a model
    without a ``reasoning`` table: its template sees ``enable_thinking`` true)."""
    reasoning_budget: int | None = None
    """Thinking tokens a request gets unless it asks (``-1``: no limit; ``0``: the end tag
    at once)."""
    pins: tuple[str, ...] = ()
    """Model ids never unloaded nor evicted."""
    tags: tuple[str, ...] = ()
    """Labels the model list shows with every generative llamacpp model."""
    verbose: bool = False
    """Answers carry llama-server's ``__verbose`` (``server.verbose_answers``)."""

    def options(self) -> dict[str, Any]:
        """The llamacpp options these flags set (``--ctx-size 0`` is resolved per file)."""
        pairs = (("n_ctx", self.ctx_size), ("n_seq_max", self.parallel),
                 ("n_threads", self.threads), ("n_batch", self.batch_size),
                 ("n_gpu_layers", self.n_gpu_layers), ("chat_template", self.chat_template),
                 ("extra_bufts", False if self.no_repack else None),
                 ("kv_unified", True if self.kv_unified else None))
        return {k: v for k, v in pairs if v is not None}

    def sampling(self) -> dict[str, Any]:
        """The ``[models.sampling]`` fields these flags set (they win over the file's)."""
        pairs = (("temperature", self.temperature), ("seed", self.seed))
        given = {k: v for k, v in pairs if v is not None}
        return {**given, "over_model_file": True} if given else {}

    def reasoning_table(self, table: dict[str, Any] | None) -> dict[str, Any] | None:
        """A model's ``[models.reasoning]`` with these flags applied (``None``: it has none
        and the flags set nothing)."""
        out = dict(table) if table is not None else None
        if self.reasoning in ("on", "off"):
            out = {**(out or {}), "enabled": self.reasoning == "on"}
        if self.reasoning_budget is not None and (out is not None or self.reasoning_budget >= 0):
            budget = None if self.reasoning_budget == -1 else self.reasoning_budget
            out = {**(out or {}), "budget_tokens": budget}
        return out

    def names(self) -> list[tuple[str, list[str]]]:
        """Each ``--alias``: the model id, then its other names."""
        out = []
        for alias in self.aliases:
            parts = [p.strip() for p in alias.split(",")]
            if not all(parts):
                raise ValueError(f"--alias {alias!r}: an empty name")
            out.append((parts[0], parts[1:]))
        return out

    def check(self) -> None:
        """``ValueError`` naming the flag whose value cannot be served."""
        if self.pooling is not None and not self.embedding:
            raise ValueError(f"--pooling {self.pooling}: embeddings are off (add --embedding)")
        if self.reasoning not in (None, "on", "off", "auto"):
            raise ValueError(f"--reasoning {self.reasoning}: give on, off or auto")
        if self.reasoning_budget is not None and self.reasoning_budget < -1:
            raise ValueError(f"--reasoning-budget {self.reasoning_budget}: give -1 (no "
                             "limit), 0 (the end tag at once) or a positive number")
        if self.n_predict is not None and (self.n_predict == 0 or self.n_predict < -1):
            raise ValueError(f"--n-predict {self.n_predict}: give -1 (until the context is "
                             "full) or a positive number")
        if self.chat_template is not None:
            from sluice.backends.llamacpp.native import init_llama
            from sluice.backends.llamacpp.templates import check_configured_template

            try:
                check_configured_template(init_llama(False), self.chat_template)
            except ValueError as exc:
                raise ValueError(f"--chat-template: {exc}") from None


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


def _file_of(model: dict[str, Any]) -> Path:
    """The GGUF file a configured llamacpp model names."""
    from sluice.backends.llamacpp.options import LlamaCppOptions, resolve_model_path
    from sluice.config import ModelConfig

    spec = ModelConfig.model_validate({**model, "options": {**model["options"], "n_ctx": 1},
                                       "embeddings": None}).spec()
    return resolve_model_path(spec, LlamaCppOptions.from_spec(spec))


def _resize(model: dict[str, Any], options: dict[str, Any]) -> None:
    """Apply llama.cpp flags to a configured model; its ``memory_bytes`` grows to what its
    file needs with the new context, if that is more."""
    from sluice.backends.llamacpp.options import LlamaCppOptions
    from sluice.backends.llamacpp.sizing import estimate_memory_bytes, gguf_shape

    path = _file_of(model)
    opts = {**model["options"], **options}
    shape = gguf_shape(path)
    if opts.get("n_ctx") == 0:
        opts["n_ctx"] = shape["n_ctx_train"] or DEFAULT_CTX_SIZE
    n_ctx = int(opts.get("n_ctx", LlamaCppOptions.n_ctx))
    model["options"] = opts
    model["memory_bytes"] = max(model["memory_bytes"], estimate_memory_bytes(path, n_ctx, shape))


def _model_flags(model: dict[str, Any], flags: LlamaFlags) -> None:
    """The sampling, token-limit and embedding flags on one generative llamacpp model; an
    embedding model's ``memory_bytes`` is worked out from the file."""
    from sluice.backends.llamacpp.sizing import estimate_memory_bytes
    from sluice.config import EmbeddingsConfig

    sampling = flags.sampling()
    if sampling:
        model["sampling"] = {**(model.get("sampling") or {}), **sampling}
    if flags.n_predict is not None:
        model["default_max_tokens"] = flags.n_predict
    if flags.tags:
        model["tags"] = list(flags.tags)
    model["reasoning"] = flags.reasoning_table(model.get("reasoning"))
    if flags.embedding:
        table = {**(model.get("embeddings") or {})}
        if flags.pooling is not None:
            table["pooling"] = flags.pooling
        n_ctx = int(table.get("n_ctx", EmbeddingsConfig.model_fields["n_ctx"].default))
        table.setdefault("memory_bytes", estimate_memory_bytes(_file_of(model), n_ctx))
        model["embeddings"] = table


def apply_llama_flags(config: Config, files: Sequence[Path], flags: LlamaFlags) -> Config:
    """``config`` with its models replaced by ``files`` (when any are given), the llama.cpp
    flags applied to every generative llamacpp model, and ``--api-key`` required.
    ``ValueError`` names a missing file, more aliases than files, or a flag whose value
    cannot be served."""
    flags.check()
    data = config.model_dump()
    options = flags.options()
    folder = any(f.is_dir() for f in files)
    files = model_files(files)
    names = flags.names()
    if len(names) > (len(files) or 1):
        raise ValueError(f"{len(names)} aliases for {len(files) or 1} model(s)")
    named: list[str] = []  # the model each --alias names, in order
    if files:
        ids = [names[i][0] if i < len(names) else model_id_for(f) for i, f in enumerate(files)]
        data["models"] = [gguf_model(f, i, options) for f, i in zip(files, ids, strict=True)]
        data["server"]["default_model"] = None
        data["groups"] = []
        named = ids[: len(names)]
    else:
        for m in data["models"]:
            if m["backend"] == "llamacpp" and m["kind"] == "generative" and options:
                _resize(m, options)
        if names:
            old = data["server"]["default_model"] or data["models"][0]["id"]
            for m in data["models"]:
                if m["id"] == old:
                    m["id"] = names[0][0]
            data["server"]["default_model"] = names[0][0]
            named = [names[0][0]]
    for model_id, (_, more) in zip(named, names, strict=True):
        data["server"]["model_aliases"].update(dict.fromkeys(more, model_id))
    for m in data["models"]:
        if m["backend"] == "llamacpp" and m["kind"] == "generative":
            _model_flags(m, flags)
    if files:
        largest = max(m["memory_bytes"] for m in data["models"])
        workers = data["workers"]
        workers["budget_bytes"] = max(workers["budget_bytes"], largest)
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
    if flags.verbose:
        data["server"]["verbose_answers"] = True
    if flags.api_keys:
        tenants = data["tenants"]
        default = next((t for t in tenants if t["id"] == "default"), None)
        if default is None:
            tenants.append({"id": "default", "api_keys": list(flags.api_keys)})
        else:
            default["api_keys"] = [*default["api_keys"], *flags.api_keys]
    return Config.model_validate(data)
