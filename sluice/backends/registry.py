"""Backend names → backend objects; real runtimes are imported only when configured."""

from __future__ import annotations

from collections.abc import Iterable

from sluice.backends.base import Backend


def make_backend(name: str) -> Backend:
    """A backend by name: ``synthetic``, ``llamacpp`` or ``onnx``."""
    if name == "synthetic":
        from sluice.backends.synthetic import SyntheticBackend

        return SyntheticBackend()
    if name == "llamacpp":
        from sluice.backends.llamacpp import LlamaCppBackend

        return LlamaCppBackend()
    if name == "onnx":
        from sluice.backends.onnx import OnnxBackend

        return OnnxBackend()
    raise ValueError(f"unknown backend {name!r}; expected synthetic, llamacpp or onnx")


def make_backends(names: Iterable[str]) -> dict[str, Backend]:
    return {name: make_backend(name) for name in sorted(set(names))}
