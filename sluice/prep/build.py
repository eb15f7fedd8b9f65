"""``sluice prepare``: build the servable model variants from installed packages, with
their measured accuracy, into a cache folder, and write the manifest the server reads.

Accuracy: a logistic-regression head is trained on the train split's embeddings of each
family's reference variant (FP32 where built, else the variant itself) and evaluated on
the test split with every variant of the family. Each step is skipped when its output
exists for the same inputs, so a second run takes seconds. What goes in comes from
``recipes`` (the variants), ``dataset`` (the labels) and ``head`` (the classifier).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sluice.cache import cache_path
from sluice.prep.dataset import LABELS, SPLIT_SEED, read_labelled, split, vader_sdist
from sluice.prep.head import train_logistic
from sluice.prep.manifest import MANIFEST, VARIANTS_SUBDIR, by_accuracy, write_config
from sluice.prep.packages import sha256_of
from sluice.prep.recipes import FULL, SMALL, VariantRecipe, tokenizer_for

EMBED_BATCH = 32


def _progress() -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), transient=False)


def _batches(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def embed_all(encoder: Any, texts: Sequence[str], progress: Any, label: str) -> np.ndarray:
    task = progress.add_task(label, total=len(texts))
    out = []
    # Length-sorted batches pad little; the order is restored afterwards.
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    for chunk in _batches([texts[i] for i in order], EMBED_BATCH):
        out.append(encoder.embed(chunk))
        progress.advance(task, len(chunk))
    emb = np.concatenate(out) if out else np.zeros((0, 1), dtype=np.float32)
    restored = np.empty_like(emb)
    restored[np.array(order, dtype=np.int64)] = emb
    return restored


def prepare(cache_dir: Path | None = None, *, full: bool = False, limit: int | None = None,
            threads: int = 2, quiet: bool = False) -> dict[str, Any]:
    """Build what is missing into ``cache_dir`` (default ``$SLUICE_CACHE_DIR/variants``);
    return (and write) the manifest."""
    from sluice.backends.onnx import Encoder

    cache = (cache_dir or cache_path(VARIANTS_SUBDIR)).resolve()
    models = cache / "models"
    models.mkdir(parents=True, exist_ok=True)
    manifest_path = cache / MANIFEST
    old: dict[str, Any] = {}
    if manifest_path.is_file():
        old = json.loads(manifest_path.read_text())
    recipes = SMALL + (FULL if full else ())
    if not full:  # keep variants an earlier --full run built
        recipes += tuple(r for r in FULL if r.name in old.get("variants", {}))
    sdist = vader_sdist(cache / "data")
    train, test = split(read_labelled(sdist), limit)
    data_key = {"sdist_sha256": sha256_of(sdist), "limit": limit, "seed": SPLIT_SEED,
                "n_train": len(train), "n_test": len(test)}
    (cache / "data" / "test.jsonl").write_text(
        "".join(json.dumps({"text": e.text, "label": LABELS[e.label], "source": e.source}) + "\n"
                for e in test))
    y_train = np.array([e.label for e in train], dtype=np.float64)
    y_test = np.array([e.label for e in test], dtype=np.int64)
    variants: dict[str, Any] = {}
    families: dict[str, list[VariantRecipe]] = {}
    for r in recipes:
        families.setdefault(r.family, []).append(r)
    with _progress() as progress:
        progress.disable = quiet
        for family, members in families.items():
            tok = tokenizer_for(family, models)
            built = {r.name: r.build(models) for r in members}
            # The head is trained on the family's FP32 variant where there is one.
            ref = next((r for r in members if r.precision == "fp32"), members[0])
            head_path = models / f"head-{family}.npz"
            keys = {r.name: {"sha256": sha256_of(built[r.name]), "data": data_key,
                             "head_from": ref.name} for r in members}
            fresh = all(old.get("variants", {}).get(r.name, {}).get("key") == keys[r.name]
                        for r in members) and head_path.is_file()
            if fresh:
                variants.update({r.name: old["variants"][r.name] for r in members})
                continue
            encoders = {r.name: Encoder(built[r.name], tok, threads=threads, pad_id=r.pad_id)
                        for r in members}
            x_train = embed_all(encoders[ref.name], [e.text for e in train], progress,
                                f"{ref.name}: embed train split")
            weight, bias = train_logistic(x_train, y_train)
            np.savez(head_path, W=weight, b=bias, labels=np.array(LABELS))
            for r in members:
                x_test = embed_all(encoders[r.name], [e.text for e in test], progress,
                                   f"{r.name}: embed test split")
                pred = np.argmax(x_test @ weight + bias, axis=1)
                accuracy = float((pred == y_test).mean()) if len(y_test) else 0.0
                variants[r.name] = {
                    "family": family, "precision": r.precision,
                    "path": str(built[r.name]), "tokenizer": str(tok), "head": str(head_path),
                    "pad_id": r.pad_id, "accuracy": round(accuracy, 4),
                    "bytes": built[r.name].stat().st_size, "key": keys[r.name],
                }
    manifest = {"cache_dir": str(cache), "labels": list(LABELS), "data": data_key,
                "test_file": str(cache / "data" / "test.jsonl"), "variants": variants}
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    write_config(manifest, cache / "sluice.toml")
    return manifest


def main(cache_dir: Path | None, *, full: bool, limit: int | None, threads: int) -> int:
    manifest = prepare(cache_dir, full=full, limit=limit, threads=threads)
    print(f"{'variant':<14}{'accuracy':>10}{'MB':>8}")
    for name in by_accuracy(manifest):
        v = manifest["variants"][name]
        print(f"{name:<14}{v['accuracy']:>10.4f}{v['bytes'] / 1e6:>8.1f}")
    print(f"manifest: {Path(manifest['cache_dir']) / MANIFEST}")
    print(f"config:   {Path(manifest['cache_dir']) / 'sluice.toml'}")
    return 0
