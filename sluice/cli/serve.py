"""``sluice serve``: the HTTP server (and gRPC with ``--grpc-port``, or replicas on Ray
Serve with ``--ray``) over the config's models, or over GGUF files given as arguments with
llama-server's flag names (``sluice.cli.serve_flags``, ``sluice.cli.serve_gguf``). On SIGTERM
or Ctrl-C it drains: new work is refused at once, and what still runs at the drain timeout
ends with a terminal error before uvicorn closes the connections."""

from __future__ import annotations

import argparse
import logging
import threading
from typing import Any

from sluice.cli.common import add_serving_flags, config_from_args
from sluice.cli.serve_flags import add_llama_server_flags

log = logging.getLogger("sluice")


def cmd_serve(args: argparse.Namespace) -> int:
    config = config_from_args(args)
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


def add_parser(sub: Any) -> None:
    """``serve`` on the subcommand parsers ``sub``."""
    serve = sub.add_parser(
        "serve", help="run the HTTP server",
        description="Serve the config's models, or GGUF files given as arguments (sluice serve "
                    "model.gguf). llama-server's flags below map to the config as their help "
                    "says (docs/compat.md has the table); the ones marked refused, and "
                    "any flag not listed, stop the start with a message naming it.")
    add_serving_flags(serve, llama=True)
    serve.add_argument("--ray", action="store_true",
                       help="run replicas on Ray Serve per the [cluster] section "
                            "(needs the cluster extra)")
    serve.add_argument("--ray-address", help="join this Ray cluster (default: "
                       "cluster.address, else start a local Ray)")
    add_llama_server_flags(serve)
    serve.set_defaults(func=cmd_serve)
