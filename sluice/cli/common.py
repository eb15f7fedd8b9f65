"""What every serving command (``serve``, ``models``, ``chat``) shares: its flags, the
configuration they name, and the process's logging."""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from sluice.cli.serve_flags import ConfigOrCtx, llama_flags_config, split_values
from sluice.config import Config, default_config, load_config, with_overrides


def config_from_args(args: argparse.Namespace) -> Config:
    """The configuration a serving command's ``args`` name: the TOML file (``--config`` or
    ``$SLUICE_CONFIG``, else the packaged default), the model files and llama-server flags
    over it, then the flags and ``SLUICE_*`` variables over that."""
    path = args.config or os.environ.get("SLUICE_CONFIG")
    config = load_config(path) if path else default_config()
    if getattr(args, "model_files", None) is not None:
        config = llama_flags_config(args, config)
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
            "cors_origins": split_values(cors) if cors else None,
            "slots_endpoint": False if getattr(args, "no_slots", False) else None,
            "web_ui": False if getattr(args, "no_ui", False) else None,
            "unknown_model": getattr(args, "unknown_model", None),
            "slot_save_path": getattr(args, "slot_save_path", None),
        },
        "scheduling": {
            "scheduler": args.scheduler,
            "router": args.router,
            "queue_capacity": args.queue_capacity,
        },
        "workers": {"count": args.workers},
        "engine": {"mode": args.mode, "cache_ram_mib": getattr(args, "cache_ram", None)},
    }
    # A Redis URL (flag or env) means the quotas are shared through it.
    redis_url = args.redis_url or env("SLUICE_REDIS_URL")
    replicas = args.replicas or env("SLUICE_QUOTA_REPLICAS")
    overrides["quota"] = {"redis_url": redis_url, "backend": "redis" if redis_url else None,
                          "replicas": int(replicas) if replicas else None}
    return with_overrides(config, overrides)


def add_serving_flags(p: argparse.ArgumentParser, llama: bool = False) -> None:
    """The flags every serving command takes; ``llama``: ``-c N`` is also llama-server's
    ``--ctx-size`` (a number), else a config file."""
    p.add_argument("--config", help="TOML config file (default: the packaged model)")
    if llama:
        p.add_argument("-c", dest="config", action=ConfigOrCtx, metavar="FILE|N",
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
    p.add_argument("--cache-ram", "-cram", type=int, metavar="MIB", dest="cache_ram",
                   help="host memory (MiB) each generative model may fill with prompt "
                        "prefixes its slots dropped, to restore them instead of computing "
                        "them again (engine.cache_ram_mib; default 1024, 0: none, -1: no "
                        "limit)")
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
