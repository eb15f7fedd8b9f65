"""``sluice profile``: the variants `sluice prepare` built, measured through the serving
path and their outputs cross-checked (``sluice.prep.profile``); the profile is written
beside the manifest and into its config."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from sluice.config import Config, load_config


def cmd_profile(args: argparse.Namespace) -> int:
    from sluice import prep
    from sluice.prep.profile import PROFILE, ProfileMismatch, run_profile

    cache = Path(args.cache) if args.cache else None
    manifest = prep.load_manifest(cache)
    if args.config:
        config = load_config(args.config)
    else:
        config = Config.model_validate(prep.config_dict(manifest, threads=args.threads))
    out = Path(args.out) if args.out else Path(manifest["cache_dir"]) / PROFILE
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    try:
        result = run_profile(config, manifest, batch_sizes=sizes, repeats=args.repeats, out=out)
    except ProfileMismatch as exc:
        print(f"PROFILE FAILED: {exc}", file=sys.stderr)
        return 1
    for name, v in result["variants"].items():
        times = "  ".join(f"b{b}={ms:.1f}ms" for b, ms in v["batch_ms"].items())
        print(f"{name:<14} acc={v['accuracy']}  {times}")
    print(f"cross-check ok: {', '.join(result['cross_check'])}")
    if not args.config:
        prep.write_config(manifest, Path(manifest["cache_dir"]) / "sluice.toml",
                          profile=result)
    print(f"profile: {out}")
    return 0


def add_parser(sub: Any) -> None:
    """``profile`` on the subcommand parsers ``sub``."""
    prof = sub.add_parser("profile", help="measure variants through the serving path and "
                                          "cross-check their outputs")
    prof.add_argument("--cache", help="the cache folder `sluice prepare` wrote")
    prof.add_argument("--config", "-c", help="serve these models instead of the manifest's")
    prof.add_argument("--batch-sizes", default="1,2,4,8")
    prof.add_argument("--repeats", type=int, default=20)
    prof.add_argument("--threads", type=int, default=1, help="ONNX threads per variant")
    prof.add_argument("--out", help="where to write the profile JSON")
    prof.add_argument("--log-level", default="warning")
    prof.set_defaults(func=cmd_profile)
