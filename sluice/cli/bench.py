"""``sluice bench``: sluice against llama-server on the packaged model — the README's
headline table, by ``bench/llm_bench.py`` from the source checkout in the current folder
(``bench/`` is not installed)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def cmd_bench(args: argparse.Namespace) -> int:
    """The headline benchmark lives in the source tree (``bench/`` is not installed): run it
    from the checkout in the current folder."""
    root = Path.cwd()
    if not (root / "bench" / "llm_bench.py").is_file():
        print("sluice bench: run it from a sluice source checkout (bench/llm_bench.py is "
              f"not under {root}); the benchmarks are not part of the installed package",
              file=sys.stderr)
        return 2
    sys.path.insert(0, str(root))
    from bench.llm_bench import main as bench_main

    return int(bench_main(args.args))


def add_parser(sub: Any) -> None:
    """``bench`` on the subcommand parsers ``sub``; its own flags reach ``bench/llm_bench.py``
    unparsed (``main`` puts them in ``args.args``)."""
    bench = sub.add_parser("bench", help="sluice against llama-server on the packaged model "
                                         "(from a source checkout)",
                           description="Run bench/llm_bench.py from the source checkout in "
                                       "the current folder: the README's headline table.")
    bench.add_argument("args", nargs=argparse.REMAINDER,
                       help="its flags: --quick, --model ID, --out PATH")
    bench.set_defaults(func=cmd_bench, log_level="warning")
