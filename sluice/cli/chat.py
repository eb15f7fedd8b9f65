"""``sluice chat PROMPT``: one reply streamed to the terminal from an in-process runtime
(no HTTP server), with the chat model's template."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from sluice.cli.common import add_serving_flags, config_from_args


def cmd_chat(args: argparse.Namespace) -> int:
    from sluice.backends.registry import make_backends
    from sluice.engine.runtime import Runtime

    config = config_from_args(args)
    model = args.model or config.default_model
    runtime = Runtime(config.runtime_config(), make_backends(m.backend for m in config.models))
    runtime.start()

    async def run() -> int:
        tok = runtime.tokenizer(model)
        if tok.chat_template is None:
            print(f"error: {model} is a completion model (no chat template); name a chat "
                  f"model with --model", file=sys.stderr)
            return 2
        prompt = tok.render_chat([{"role": "user", "content": args.prompt}])
        sampling = {} if args.temperature is None else {"temperature": args.temperature}
        handle = await runtime.generate(model, prompt, max_tokens=args.max_tokens, **sampling)
        async for piece in handle.tokens():
            sys.stdout.write(piece)
            sys.stdout.flush()
        final = handle.final
        sys.stdout.write("\n")
        if final is None or final.error:
            print(f"error: {final.error if final else 'no result'}", file=sys.stderr)
            return 1
        return 0

    try:
        return asyncio.run(run())
    finally:
        runtime.stop(drain_timeout_s=1.0)


def add_parser(sub: Any) -> None:
    """``chat`` on the subcommand parsers ``sub``."""
    chat = sub.add_parser("chat", help="stream one reply to the terminal")
    add_serving_flags(chat)
    chat.add_argument("prompt")
    chat.add_argument("--model")
    chat.add_argument("--max-tokens", type=int, default=128)
    chat.add_argument("--temperature", type=float,
                      help="0 is greedy (default: the model's, see /v1/models)")
    chat.set_defaults(func=cmd_chat)
