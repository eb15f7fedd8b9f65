"""The gRPC server: ``sluice.v1.Inference``, health and reflection on one ``grpc.aio`` server,
on the HTTP server's event loop (started and stopped by the app's lifespan) and its own
port."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from sluice.server.context import AppContext
from sluice.server.grpc.health import ReadinessHealth
from sluice.server.grpc.service import InferenceService
from sluice.v1 import inference_pb2, inference_pb2_grpc

log = logging.getLogger("sluice.grpc")
MAX_MESSAGE_BYTES = 4 * 1024 * 1024


class GrpcServer:
    """Owns the ``grpc.aio.Server``; ``start`` binds ``port`` (0: a free one) on every host,
    the same port on each."""

    def __init__(self, ctx: AppContext, hosts: Sequence[str], port: int) -> None:
        self.ctx = ctx
        self.hosts = list(hosts)
        self.requested_port = port
        self.port: int | None = None
        """The bound port, once started."""
        self.health = ReadinessHealth(ctx)
        server = ctx.config.server
        # One body limit for both transports: a request message past ``max_body_bytes`` is
        # RESOURCE_EXHAUSTED, as an HTTP body past it is 413. Answers may be larger.
        self.server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", server.max_body_bytes),
                ("grpc.max_send_message_length", max(MAX_MESSAGE_BYTES, server.max_body_bytes)),
            ],
            # past it a call is RESOURCE_EXHAUSTED at once, never queued in grpc's own threads
            maximum_concurrent_rpcs=server.grpc_max_concurrent_rpcs)
        # The generated registration function carries no annotations.
        inference_pb2_grpc.add_InferenceServicer_to_server(  # type: ignore[no-untyped-call]
            InferenceService(ctx), self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = (inference_pb2.DESCRIPTOR.services_by_name["Inference"].full_name,
                 health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                 reflection.SERVICE_NAME)
        reflection.enable_server_reflection(names, self.server)

    async def start(self) -> int:
        port = self.requested_port
        for host in self.hosts:
            address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            bound = self.server.add_insecure_port(address)
            if not bound:
                raise OSError(f"gRPC: cannot bind {address}")
            port = bound
        self.port = port
        await self.server.start()
        await self.health.start()
        log.info("serving gRPC on %s port %d", ", ".join(self.hosts), self.port)
        return self.port

    async def stop(self, grace_s: float) -> None:
        """Health turns NOT_SERVING; new calls are refused; calls in flight get ``grace_s``
        to finish, then are cancelled."""
        await self.health.stop()
        await self.server.stop(grace_s)
