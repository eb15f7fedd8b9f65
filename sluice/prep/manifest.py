"""The manifest ``sluice prepare`` writes (every variant with its files and measured
accuracy) and the server config built from it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sluice.cache import cache_path

MANIFEST = "manifest.json"
VARIANTS_SUBDIR = "variants"
"""The cache sub-folder ``sluice prepare`` builds into (``$SLUICE_CACHE_DIR/variants``)."""


def load_manifest(cache_dir: Path | None = None) -> dict[str, Any]:
    """The manifest in ``cache_dir`` (default ``$SLUICE_CACHE_DIR/variants``)."""
    path = (cache_dir or cache_path(VARIANTS_SUBDIR)) / MANIFEST
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
            profiled = (profile or {}).get("variants", {}).get(name, {})
            service = profiled.get("batch_ms")
            if service:
                opts["service_ms"] = {str(b): ms for b, ms in service.items()}
            if profiled.get("length"):
                opts["length_prior"] = {k: v for k, v in profiled["length"].items()
                                        if k != "batches"}
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
