"""``grpc.health.v1.Health`` that answers what ``/ready`` answers: SERVING exactly when
``sluice.server.health.readiness`` says ready, for the server as a whole (``""``) and for
``sluice.v1.Inference``. ``Check`` decides at each call; ``Watch`` streams changes, polled
every ``poll_s``. Built on grpcio-health-checking's asyncio servicer."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from grpc_health.v1 import health_pb2
from grpc_health.v1.health import aio as health_aio

from sluice.server.context import AppContext
from sluice.server.health import readiness

INFERENCE_SERVICE = "sluice.v1.Inference"
SERVICES = ("", INFERENCE_SERVICE)


class ReadinessHealth(health_aio.HealthServicer):  # type: ignore[misc]  # untyped in stubs
    """The standard health service, its status taken from sluice's readiness."""

    def __init__(self, ctx: AppContext, poll_s: float = 0.5) -> None:
        super().__init__()
        self._ctx = ctx
        self._poll_s = poll_s
        self._task: asyncio.Task[None] | None = None

    async def refresh(self) -> None:
        status = (health_pb2.HealthCheckResponse.SERVING if readiness(self._ctx).ok
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        for service in SERVICES:
            await self.set(service, status)

    async def Check(self, request: health_pb2.HealthCheckRequest, context: Any) -> Any:
        await self.refresh()
        return await super().Check(request, context)

    async def _poll(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self._poll_s)

    async def start(self) -> None:
        await self.refresh()
        self._task = asyncio.get_running_loop().create_task(self._poll())

    async def stop(self) -> None:
        """NOT_SERVING from now on (the server is going away), polling stopped."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.enter_graceful_shutdown()
