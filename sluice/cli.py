"""``sluice serve | models | chat | prepare | profile | simulate | costs | bench`` — the
command line.

Settings come from the TOML file (``--config`` or ``$SLUICE_CONFIG``), with flags and
``SLUICE_*`` environment variables over it; with no file, the packaged SmolLM2-135M-Instruct
is served as ``smollm2-135m-instruct`` (the default) and Gemma 3 270M as ``gemma-3-270m``.
``sluice serve PATH.gguf ...`` serves model files instead, with llama-server's flag names
(``sluice.serve_gguf``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sluice.config import Config, default_config, describe_errors, load_config, with_overrides

log = logging.getLogger("sluice")


def _load(args: argparse.Namespace) -> Config:
    path = args.config or os.environ.get("SLUICE_CONFIG")
    config = load_config(path) if path else default_config()
    if getattr(args, "model_files", None) is not None:
        config = _llama_flags(args, config)
    env = os.environ.get
    cors = getattr(args, "cors_origins", None)
    port = args.port if args.port is not None else env("SLUICE_PORT")
    grpc_port = args.grpc_port if args.grpc_port is not None else env("SLUICE_GRPC_PORT")
    overrides: dict[str, dict[str, Any]] = {
        "server": {
            "host": args.host or env("SLUICE_HOST"),
            "port": int(port) if port is not None else None,
            "grpc_port": int(grpc_port) if grpc_port is not None else None,
            "admin_key": args.admin_key or env("SLUICE_ADMIN_KEY"),
            "admin_key_file": args.admin_key_file or env("SLUICE_ADMIN_KEY_FILE"),
            "open_admin": True if getattr(args, "open_admin", False) else None,
            "metrics_key": env("SLUICE_METRICS_KEY"),
            "log_content": True if getattr(args, "log_content", False) else None,
            "cors_origins": _split(cors) if cors else None,
            "slots_endpoint": False if getattr(args, "no_slots", False) else None,
            "slot_save_path": getattr(args, "slot_save_path", None),
        },
        "scheduling": {
            "scheduler": args.scheduler,
            "router": args.router,
            "queue_capacity": args.queue_capacity,
        },
        "workers": {"count": args.workers},
        "engine": {"mode": args.mode},
    }
    # A Redis URL (flag or env) means the quotas are shared through it.
    redis_url = args.redis_url or env("SLUICE_REDIS_URL")
    replicas = args.replicas or env("SLUICE_QUOTA_REPLICAS")
    overrides["quota"] = {"redis_url": redis_url, "backend": "redis" if redis_url else None,
                          "replicas": int(replicas) if replicas else None}
    return with_overrides(config, overrides)


def _split(values: str | list[str]) -> list[str]:
    """Comma-separated values (llama-server's lists), from one flag or several."""
    items = [values] if isinstance(values, str) else values
    return [part.strip() for item in items for part in item.split(",") if part.strip()]


REFUSED_POOLING = {
    "none": "per-token embeddings are not served (OpenAI's and Ollama's embeddings are one "
            "vector per input); use mean, cls or last",
    "rank": "reranking is not served from llama-server's flags; use mean, cls or last",
}


def _llama_flags(args: argparse.Namespace, config: Config) -> Config:
    from sluice.serve_gguf import LlamaFlags, apply_llama_flags

    template = args.chat_template
    if args.chat_template_file:
        template = Path(args.chat_template_file).read_text(encoding="utf-8")
    keys = _split(args.api_key or [])
    if os.environ.get("SLUICE_API_KEY"):
        keys.append(os.environ["SLUICE_API_KEY"])
    if args.pooling in REFUSED_POOLING:
        raise ValueError(f"--pooling {args.pooling}: {REFUSED_POOLING[args.pooling]}")
    flags = LlamaFlags(
        ctx_size=args.ctx_size, parallel=args.parallel, threads=args.threads,
        batch_size=args.batch_size, n_gpu_layers=args.n_gpu_layers, chat_template=template,
        no_repack=args.no_repack, kv_unified=args.kv_unified, temperature=args.temp,
        seed=None if args.seed is None or args.seed < 0 else args.seed,
        n_predict=args.n_predict, embedding=args.embedding, pooling=args.pooling,
        api_keys=tuple(keys), aliases=tuple(args.alias or ()),
        keep_alive=args.keep_alive or os.environ.get("SLUICE_KEEP_ALIVE"),
        pins=tuple(args.pin or ()),
    )
    files = [Path(f) for f in [*args.model_files, *(args.model or [])]]
    return apply_llama_flags(config, files, flags)


class _Refused(argparse.Action):
    """A llama-server flag whose meaning sluice does not have: naming it is an error that
    says why (never ignored)."""

    def __init__(self, option_strings: Sequence[str], dest: str, why: str = "",
                 **kwargs: Any) -> None:
        self.why = why
        super().__init__(option_strings, dest, nargs=0, help=f"refused: {why}",
                         default=argparse.SUPPRESS)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        parser.error(f"{option_string}: {self.why}")


class _ConfigOrCtx(argparse.Action):
    """``-c``: a number is llama-server's ``--ctx-size``, anything else sluice's
    ``--config``."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        if str(values).isdigit():
            namespace.ctx_size = int(values)
        else:
            namespace.config = values


def _llama_server_flags(p: argparse.ArgumentParser) -> None:
    """llama-server's (and vLLM's) flag names where they mean the same thing; the ones whose
    meaning sluice has not are refused by name."""
    p.add_argument("model_files", nargs="*", metavar="PATH.gguf",
                   help="serve these GGUF files, or every GGUF in a folder (instead of the "
                        "config's models)")
    p.add_argument("-m", "--model", action="append", metavar="PATH.gguf",
                   help="a GGUF file to serve (llama-server's -m; repeatable)")
    p.add_argument("--alias", "--served-model-name", action="append", metavar="NAME[,NAME]",
                   help="the model id clients use, one per file in order (default: the "
                        "file's name); more names after commas are aliases of it")
    p.add_argument("--ctx-size", type=int, metavar="N",
                   help="KV cells per model, split over --parallel sequences (0 = the "
                        "model's trained context; default 8192); also -c N")
    p.add_argument("-np", "--parallel", type=int, metavar="N",
                   help="sequences decoded at once per model (default 8)")
    p.add_argument("-t", "--threads", type=int, metavar="N", help="CPU threads per decode")
    p.add_argument("-b", "--batch-size", type=int, metavar="N",
                   help="the most tokens in one llama_decode (default 512)")
    p.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", type=int, metavar="N",
                   help="layers offloaded to a GPU (for a GPU build of llama.cpp)")
    p.add_argument("--no-repack", action="store_true",
                   help="keep the weights as the file lays them out (llama.cpp's extra "
                        "buffer types off: the extra_bufts option)")
    p.add_argument("--kv-unified", action="store_true",
                   help="one KV pool that every sequence fills (the kv_unified option)")
    p.add_argument("--chat-template", metavar="NAME|TEMPLATE",
                   help="a llama.cpp template name (chatml, llama3, ...), or the template's "
                        "text, rendered as Jinja")
    p.add_argument("--chat-template-file", metavar="PATH", help="a Jinja chat template file")
    p.add_argument("--jinja", action="store_true",
                   help="accepted: chat templates are always rendered as Jinja")
    p.add_argument("--temp", type=float, metavar="T",
                   help="the temperature of requests that send none ([models.sampling], over "
                        "the model file's own, as in llama-server)")
    p.add_argument("--seed", type=int, metavar="N",
                   help="the seed of requests that send none (-1: each request its own)")
    p.add_argument("-n", "--n-predict", type=int, metavar="N",
                   help="the token limit of requests that name none (default_max_tokens; "
                        "-1: until the context is full)")
    p.add_argument("--embedding", "--embeddings", action="store_true",
                   help="every model also embeds, as MODEL:embedding, on /v1/embeddings and "
                        "Ollama's embed routes (generation stays on)")
    p.add_argument("--pooling", choices=["mean", "cls", "last", "none", "rank"],
                   help="how --embedding pools an input's tokens (default: the file's own, "
                        "else mean; none and rank are refused)")
    p.add_argument("--no-context-shift", action="store_true",
                   help="accepted: sluice never shifts a context (a request that does not "
                        "fit is refused)")
    p.add_argument("--context-shift", action=_Refused,
                   why="sluice does not shift a full context (it would drop the start of "
                       "the conversation); a request whose prompt and max_tokens exceed the "
                       "context is refused with context_length_exceeded")
    p.add_argument("--cont-batching", action="store_true",
                   help="accepted: generative models batch continuously (see --mode)")
    p.add_argument("--metrics", action="store_true",
                   help="accepted: /metrics is always served (see server.metrics_key)")
    p.add_argument("--slots", action="store_true",
                   help="accepted: GET /slots is served unless --no-slots")
    p.add_argument("--no-slots", action="store_true",
                   help="GET /slots and POST /slots/{id} answer 501 "
                        "(server.slots_endpoint = false)")
    p.add_argument("--props", action=_Refused,
                   why="sluice does not change its settings at run time (POST /props "
                       "answers 501): set them in the config file")
    p.add_argument("--slot-save-path", metavar="DIR",
                   help="the folder POST /slots/{id}?action=save|restore writes and reads "
                        "a slot's KV in (server.slot_save_path; unset: 501)")
    p.add_argument("--cors-origins", metavar="ORIGIN[,ORIGIN]",
                   help="origins browsers may call from (server.cors_origins; *: any)")
    p.add_argument("--keep-alive", metavar="DURATION",
                   help="unload a model idle this long (Ollama's forms: 300, 5m, 1h; 0: after "
                        "each request; -1: never; default: never for files, 5m for a folder; "
                        "or $SLUICE_KEEP_ALIVE); a request's keep_alive overrides it")
    p.add_argument("--pin", action="append", metavar="NAME",
                   help="keep this model loaded: never unloaded nor evicted (repeatable)")
    p.add_argument("--api-key", action="append", metavar="KEY[,KEY]",
                   help="require this API key (repeatable or comma-separated; or "
                        "$SLUICE_API_KEY)")


def _common(p: argparse.ArgumentParser, llama: bool = False) -> None:
    """The flags every serving command takes; ``llama``: ``-c N`` is also llama-server's
    ``--ctx-size`` (a number), else a config file."""
    p.add_argument("--config", help="TOML config file (default: the packaged model)")
    if llama:
        p.add_argument("-c", dest="config", action=_ConfigOrCtx, metavar="FILE|N",
                       help="a config file (--config), or a number: --ctx-size")
    else:
        p.add_argument("-c", dest="config", help="--config")
    p.add_argument("--host", help="bind address, or several separated by commas "
                   "(default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 8000)")
    p.add_argument("--grpc-port", type=int, help="also serve the gRPC API on this port "
                   "(0: a free one; or $SLUICE_GRPC_PORT; needs the grpc extra)")
    p.add_argument("--admin-key", help="require this key on /admin (prefer $SLUICE_ADMIN_KEY "
                   "or --admin-key-file: a command line is visible to every local user)")
    p.add_argument("--admin-key-file", metavar="PATH",
                   help="read the admin key from this file (or $SLUICE_ADMIN_KEY_FILE)")
    p.add_argument("--open-admin", action="store_true",
                   help="without an admin key, open /admin to anyone (local development "
                        "only; by default it is disabled)")
    p.add_argument("--scheduler", choices=["fifo", "workload_aware", "priority_edf", "wfq"])
    p.add_argument("--router", choices=["round_robin", "least_loaded", "residency_aware"])
    p.add_argument("--queue-capacity", type=int)
    p.add_argument("--workers", type=int, help="number of workers")
    p.add_argument("--mode", choices=["continuous", "static", "serial"],
                   help="generative batching mode")
    p.add_argument("--redis-url", help="share tenant quotas through this Redis "
                   "(or $SLUICE_REDIS_URL)")
    p.add_argument("--replicas", type=int, help="replicas sharing the quotas; each enforces "
                   "1/replicas while Redis is unreachable (or $SLUICE_QUOTA_REPLICAS)")
    p.add_argument("--log-level", default=os.environ.get("SLUICE_LOG_LEVEL", "info"))
    p.add_argument("--log-format", choices=["text", "json"],
                   default=os.environ.get("SLUICE_LOG_FORMAT", "text"),
                   help="json: one JSON object per line, with an access line per request "
                   "(or $SLUICE_LOG_FORMAT)")
    p.add_argument("--log-content", action="store_true",
                   help="log prompt text in access lines (debugging only)")


def setup_logging(level: str, log_format: str) -> None:
    """Root logging: text, or one JSON object per line (python-json-logger) whose keys are
    the time, level, logger, message and any fields the record carries (the access log's)."""
    handler = logging.StreamHandler()
    if log_format == "json":
        from pythonjsonlogger.json import JsonFormatter

        handler.setFormatter(JsonFormatter(
            "%(asctime)s %(levelname)s %(name)s %(message)s",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"}))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler])


def cmd_serve(args: argparse.Namespace) -> int:
    config = _load(args)
    if args.ray:  # replicas on Ray Serve, from the [cluster] section (sluice.cluster)
        if len(config.server.hosts) > 1:
            raise ValueError(f"--ray: Ray Serve's proxy binds one address, not "
                             f"{config.server.host}")
        from sluice.cluster.app import serve_on_ray

        return serve_on_ray(config, address=args.ray_address)

    import uvicorn

    from sluice.server.app import create_app
    from sluice.server.connections import bind_sockets, uvicorn_settings

    hosts = config.server.hosts
    # uvicorn binds one host; several are bound here and handed to it
    sockets = bind_sockets(hosts, config.server.port) if len(hosts) > 1 else None
    app = create_app(config)
    runtime = app.state.ctx.runtime

    class DrainingServer(uvicorn.Server):
        """On SIGTERM / Ctrl-C: refuse new work at once, then let uvicorn finish the
        open connections within the drain timeout."""

        def handle_exit(self, sig: int, frame: Any) -> None:
            if not runtime.draining:
                runtime.begin_drain()
                # Ends what is still running at the drain timeout with a terminal error
                # (503 ``shutdown``, or an error event on a stream), before uvicorn's own
                # graceful timeout (one second later) would cut the connections.
                threading.Thread(target=runtime.stop, args=(config.server.drain_timeout_s,),
                                 name="sluice-drain", daemon=True).start()
            super().handle_exit(sig, frame)
            # uvicorn re-raises the captured signal after shutdown, so the process would
            # die by SIGTERM; a completed graceful drain is a clean exit (status 0).
            captured = getattr(self, "_captured_signals", None)
            if isinstance(captured, list):
                captured.clear()

    server = DrainingServer(
        uvicorn.Config(
            app,
            host=config.server.host,
            port=config.server.port,
            log_level=args.log_level,
            timeout_graceful_shutdown=int(config.server.drain_timeout_s) + 1,
            **uvicorn_settings(config.server),
            # sluice writes its own access line per request (sluice.server.access).
            access_log=False,
            # JSON: uvicorn's loggers go through the root handler like everything else.
            log_config=None if args.log_format == "json" else uvicorn.config.LOGGING_CONFIG,
        )
    )
    if sockets is None:
        log.info("serving on http://%s:%d", config.server.host, config.server.port)
    else:
        log.info("serving on %s", ", ".join(
            f"http://{h if ':' not in h else f'[{h}]'}:{s.getsockname()[1]}"
            for h, s in zip(hosts, sockets, strict=True)))
    server.run(sockets=sockets)
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    config = _load(args)
    for spec in (s for m in config.models for s in m.specs()):
        default = " (default)" if spec.model_id == config.default_model else ""
        print(f"{spec.model_id}\t{spec.kind}\t{spec.backend}\t{spec.task}\t"
              f"{spec.memory_bytes} bytes{default}")
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from sluice.backends.registry import make_backends
    from sluice.engine.runtime import Runtime

    config = _load(args)
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


def cmd_prepare(args: argparse.Namespace) -> int:
    from pathlib import Path

    from sluice.prep.build import main as prepare_main

    return prepare_main(Path(args.cache) if args.cache else None, full=args.full,
                        limit=args.limit, threads=args.threads)


def cmd_profile(args: argparse.Namespace) -> int:
    from pathlib import Path

    from sluice import prep
    from sluice.config import Config
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


def serve_config(argv: Sequence[str]) -> Config:
    """The configuration ``sluice serve ARGV`` serves (``SLUICE_*`` variables included);
    ``ValueError`` or pydantic's ``ValidationError`` as ``sluice serve`` reports them."""
    args = build_parser().parse_args(["serve", *argv])
    return _load(args)


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser, every subcommand included."""
    parser = argparse.ArgumentParser(prog="sluice", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve", help="run the HTTP server",
        description="Serve the config's models, or GGUF files given as arguments (sluice serve "
                    "model.gguf). llama-server's flags below map to the config as their help "
                    "says (docs/operations.md has the table); the ones marked refused, and "
                    "any flag not listed, stop the start with a message naming it.")
    _common(serve, llama=True)
    serve.add_argument("--ray", action="store_true",
                       help="run replicas on Ray Serve per the [cluster] section "
                            "(needs the cluster extra)")
    serve.add_argument("--ray-address", help="join this Ray cluster (default: "
                       "cluster.address, else start a local Ray)")
    _llama_server_flags(serve)
    serve.set_defaults(func=cmd_serve)
    models = sub.add_parser("models", help="list the configured models")
    _common(models, llama=True)
    _llama_server_flags(models)
    models.set_defaults(func=cmd_models)
    chat = sub.add_parser("chat", help="stream one reply to the terminal")
    _common(chat)
    chat.add_argument("prompt")
    chat.add_argument("--model")
    chat.add_argument("--max-tokens", type=int, default=128)
    chat.add_argument("--temperature", type=float,
                      help="0 is greedy (default: the model's, see /v1/models)")
    chat.set_defaults(func=cmd_chat)
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
    from sluice.costs_cli import add_parser as add_costs
    from sluice.simulate_cli import add_parser as add_simulate

    add_simulate(sub)
    add_costs(sub)
    bench = sub.add_parser("bench", help="sluice against llama-server on the packaged model "
                                         "(from a source checkout)",
                           description="Run bench/llm_bench.py from the source checkout in "
                                       "the current folder: the README's headline table.")
    bench.add_argument("args", nargs=argparse.REMAINDER,
                       help="its flags: --quick, --model ID, --out PATH")
    bench.set_defaults(func=cmd_bench, log_level="warning")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
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


if __name__ == "__main__":
    raise SystemExit(main())
