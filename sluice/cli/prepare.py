"""``sluice prepare``: the ONNX model variants, their labelled data and accuracy, the
manifest and a config (``sluice.prep.build``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def cmd_prepare(args: argparse.Namespace) -> int:
    from sluice.prep.build import main as prepare_main

    return prepare_main(Path(args.cache) if args.cache else None, full=args.full,
                        limit=args.limit, threads=args.threads)


def add_parser(sub: Any) -> None:
    """``prepare`` on the subcommand parsers ``sub``."""
    prep = sub.add_parser("prepare", help="build the ONNX model variants and their accuracy")
    prep.add_argument("--cache",
                      help="cache folder (default $SLUICE_CACHE_DIR/variants, "
                           "i.e. ~/.cache/sluice/variants)")
    prep.add_argument("--full", action="store_true",
                      help="also export MiniLM FP32 and mpnet FP32/INT8 (needs torch)")
    prep.add_argument("--limit", type=int, help="use only this many labelled snippets")
    prep.add_argument("--threads", type=int, default=2)
    prep.add_argument("--log-level", default="warning")
    prep.set_defaults(func=cmd_prepare)
