"""The one cache folder sluice writes to, and its sub-folders.

``$SLUICE_CACHE_DIR`` (default ``~/.cache/sluice``) is the root; each kind of artefact
has its own sub-folder: ``models`` (the packaged default GGUF, assembled once),
``variants`` (what ``sluice prepare`` builds, its manifest and server config) and
``llama-server`` (the peer binary the benchmarks build).
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR_ENV = "SLUICE_CACHE_DIR"
"""Environment variable naming the cache root."""


def cache_path(*parts: str) -> Path:
    """The cache root (``$SLUICE_CACHE_DIR``, else ``~/.cache/sluice``) joined with
    ``parts``, e.g. ``cache_path("variants")``. Creates nothing."""
    env = os.environ.get(CACHE_DIR_ENV)
    root = Path(env) if env else Path.home() / ".cache" / "sluice"
    return root.joinpath(*parts)


__all__ = ["CACHE_DIR_ENV", "cache_path"]
