"""``sluice models``: the configured models (or the GGUF files given, with llama-server's
flags applied), one line each: id, kind, backend, task, memory, and which is the default."""

from __future__ import annotations

import argparse
from typing import Any

from sluice.cli.common import add_serving_flags, config_from_args
from sluice.cli.serve_flags import add_llama_server_flags


def cmd_models(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    for spec in (s for m in config.models for s in m.specs()):
        default = " (default)" if spec.model_id == config.default_model else ""
        print(f"{spec.model_id}\t{spec.kind}\t{spec.backend}\t{spec.task}\t"
              f"{spec.memory_bytes} bytes{default}")
    return 0


def add_parser(sub: Any) -> None:
    """``models`` on the subcommand parsers ``sub``."""
    models = sub.add_parser("models", help="list the configured models")
    add_serving_flags(models, llama=True)
    add_llama_server_flags(models)
    models.set_defaults(func=cmd_models)
