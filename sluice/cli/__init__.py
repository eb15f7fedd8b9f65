"""``sluice serve | models | chat | prepare | profile | simulate | plan | costs | bench`` — the
command line.

Settings come from the TOML file (``--config`` or ``$SLUICE_CONFIG``), with flags and
``SLUICE_*`` environment variables over it; with no file, the packaged SmolLM2-135M-Instruct
is served as ``smollm2-135m-instruct`` (the default) and Gemma 3 270M as ``gemma-3-270m``.
``sluice serve PATH.gguf ...`` serves model files instead, with llama-server's flag names
(``sluice.cli.serve_gguf``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from sluice.cli import (
    bench,
    chat,
    costs,
    models,
    plan,
    prepare,
    profile,
    serve,
    simulate,
)
from sluice.cli.common import config_from_args, setup_logging
from sluice.config import Config, describe_errors

__all__ = ["build_parser", "main", "serve_config"]

_COMMANDS = (serve, models, chat, prepare, profile, simulate, plan, costs, bench)
"""One module per subcommand, each with ``add_parser(sub)``, in ``sluice --help``'s order."""


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser, every subcommand included."""
    parser = argparse.ArgumentParser(prog="sluice", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for command in _COMMANDS:
        command.add_parser(sub)
    return parser


def serve_config(argv: Sequence[str]) -> Config:
    """The configuration ``sluice serve ARGV`` serves (``SLUICE_*`` variables included);
    ``ValueError`` or pydantic's ``ValidationError`` as ``sluice serve`` reports them."""
    args = build_parser().parse_args(["serve", *argv])
    return config_from_args(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit status. A bad configuration (and, for ``serve`` and
    ``models``, a bad flag value or file) is one line on stderr and status 2."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "bench":
        args.args = [*extra, *args.args]  # its own flags, parsed by bench/llm_bench.py
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    setup_logging(args.log_level, getattr(args, "log_format", "text"))
    try:
        return int(args.func(args))
    except ValidationError as exc:
        print(f"invalid configuration: {describe_errors(exc)}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as exc:
        if args.command not in ("serve", "models"):
            raise
        print(f"sluice {args.command}: {exc}", file=sys.stderr)
        return 2
