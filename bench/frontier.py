"""The variant frontier: each prepared variant's held-out accuracy against its service
time measured through the serving path, from what ``sluice prepare`` and ``sluice
profile`` wrote (run those first, e.g. ``scripts/prepare_full.sh``).

    .venv/bin/python bench/frontier.py

Writes ``bench/results/frontier.json`` and ``.png`` and prints the markdown table
of ``docs/benchmarks.md``. It measures nothing itself: it joins the manifest (accuracy,
data split, size) with the profile (batch times, cross-check) and checks they agree.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sluice import prep  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def frontier(manifest: dict[str, Any], profile: dict[str, Any]) -> dict[str, Any]:
    """One record per variant profiled, most accurate first. Raises ``ValueError`` when
    the profile misses a variant, or its cross-check failed."""
    variants: dict[str, Any] = {}
    for name in prep.by_accuracy(manifest):
        prof = profile["variants"].get(name)
        if prof is None:
            raise ValueError(f"{name} is prepared but not profiled: run `sluice profile`")
        check = profile.get("cross_check", {}).get(name, {})
        if not check.get("ok"):
            raise ValueError(f"{name}: the profile's cross-check did not pass: {check}")
        v = manifest["variants"][name]
        variants[name] = {
            "accuracy": v["accuracy"], "precision": v["precision"], "family": v["family"],
            "mb": round(v["bytes"] / 1e6, 1), "threads": prof["threads"],
            **{k: prof[k] for k in ("batch_ms", "p50_ms", "p95_ms", "samples")},
        }
    return {"data": manifest["data"], "variants": variants,
            "cross_check": profile.get("cross_check", {}), "machine": profile.get("machine"),
            "profile_repeats": profile.get("repeats")}


def markdown(result: dict[str, Any]) -> str:
    lines = ["| variant | accuracy | batch 1 | batch 8 | per item at batch 8 | MB |",
             "|---|---|---|---|---|---|"]
    for name, v in result["variants"].items():
        b1, b8 = v["batch_ms"].get("1"), v["batch_ms"].get("8")
        per8 = f"{b8 / 8:.1f} ms" if b8 else "–"
        lines.append(f"| {name} | {v['accuracy']:.3f} | {b1:.1f} ms | "
                     f"{f'{b8:.0f} ms' if b8 else '–'} | {per8} | {v['mb']:.0f} |")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for i, (name, v) in enumerate(result["variants"].items()):
        x, y = v["batch_ms"]["1"], 100 * v["accuracy"]
        ax.scatter([x], [y], s=20 + v["mb"] / 3)
        # Alternate labels above / below: neighbours on the frontier sit close together.
        ax.annotate(name, (x, y), textcoords="offset points",
                    xytext=(6, 5 if i % 2 == 0 else -12), fontsize=8)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("service time at batch 1, ms (serving path, 1 ONNX thread; log)")
    ax.set_ylabel("held-out sentiment accuracy, %")
    d = result["data"]
    ax.set_title(f"variant frontier ({d['n_train']} train / {d['n_test']} test snippets)",
                 fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache", help="the cache folder `sluice prepare` wrote")
    p.add_argument("--out", default=str(RESULTS / "frontier.json"))
    args = p.parse_args()
    manifest = prep.load_manifest(Path(args.cache) if args.cache else None)
    profile = json.loads((Path(manifest["cache_dir"]) / "profile.json").read_text())
    result = frontier(manifest, profile)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    plot(result, out.with_suffix(".png"))
    print(markdown(result))
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
