"""The front end behind Serve's HTTP proxy: read, fingerprint, route, relay.

For each HTTP request: read the body (at most ``server.max_body_bytes``: 413 past it), build
the ``RouteHint`` (model, prompt-prefix key), and call the replica deployment through a
handle whose request router ranks the replicas. The replica's response is relayed as it
comes — SSE events one by one — with the replica's decision headers.

Bounded admission end to end: the handle holds at most ``cluster.max_queued_requests``
while every replica is full; past that Serve raises ``BackPressureError`` and this answers
503 ``queue_full`` with a Retry-After computed from the completions it has seen (the same
rule as a replica's own queue). A replica that answers 503 ``queue_full`` / ``draining``
itself (its view of its queue was fresher than the router's) is excluded and the request
tried once more elsewhere. A replica that dies before answering is retried elsewhere; one
that dies mid-response fails that response alone (an SSE stream ends with an error event
and ``[DONE]``) and the router stops choosing it.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Protocol, cast

from ray.exceptions import RayError
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from sluice.cluster.asgi import HttpCall, ResponseStart
from sluice.cluster.hints import RouteHint, route_hint
from sluice.config import Config
from sluice.policy.queues.admission import Rejection, retry_after_for_backlog
from sluice.policy.queues.rates import RateMeter
from sluice.server.errors import APIError, rejection_error

log = logging.getLogger("sluice.cluster")

ATTEMPTS = 2
"""Replicas tried for one request: the router's choice, then one more if it refused."""
RETRYABLE_CODES = frozenset({"queue_full", "draining"})
"""Refusals by a replica that another replica may not give."""
MIN_RETRY_AFTER_S, MAX_RETRY_AFTER_S = 1.0, 60.0


async def read_body(request: Request, limit_bytes: int) -> bytes:
    """The whole body, or 413 ``body_too_large`` past ``limit_bytes``."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit_bytes:
        raise _too_large(limit_bytes)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit_bytes:
            raise _too_large(limit_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit_bytes: int) -> APIError:
    return APIError(413, f"Request body exceeds {limit_bytes} bytes", code="body_too_large")


class PartStream(Protocol):
    """A replica's streamed answer: ``ResponseStart`` first, then body chunks."""

    def __aiter__(self) -> PartStream: ...

    async def __anext__(self) -> Any: ...

    def cancel(self) -> None: ...


def sse_error(message: str, code: str) -> bytes:
    """An SSE error event and the end of the stream, as sluice's own streams end."""
    err = {"error": {"message": message, "type": "server_error", "param": None, "code": code}}
    return f"data: {json.dumps(err, separators=(',', ':'))}\n\ndata: [DONE]\n\n".encode()


class RelayResponse(Response):
    """Sends the replica's start, then its parts as they arrive."""

    def __init__(self, start: ResponseStart, first: list[bytes],
                 parts: PartStream, on_end: Any) -> None:
        self.status_code = start.status
        self.background = None
        self._start = start
        self._first = first
        self._parts = parts
        self._on_end = on_end

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = self._start
        # Serve's proxy adds its own x-request-id (the one the replica was given).
        headers = [(k, v) for k, v in start.headers if k != b"x-request-id"]
        await send({"type": "http.response.start", "status": start.status,
                    "headers": headers})
        finished = False
        try:
            for part in self._first:
                await send({"type": "http.response.body", "body": part, "more_body": True})
            async for part in self._parts:
                await send({"type": "http.response.body", "body": part, "more_body": True})
            finished = True
        except RayError as exc:
            replica = start.header("x-sluice-replica")
            log.warning("replica %s failed mid-response: %s", replica, type(exc).__name__)
            if (start.header("content-type") or "").startswith("text/event-stream"):
                await send({"type": "http.response.body", "more_body": True, "body": sse_error(
                    f"The replica serving this request ({replica}) failed.", "replica_failed")})
        finally:
            if not finished:
                self._parts.cancel()  # the client left, or the replica failed
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        self._on_end()


class SluiceIngress:
    """The body of the front-end deployment (``sluice.cluster.app`` wraps it for Serve)."""

    def __init__(self, replicas: DeploymentHandle[Any], config_data: dict[str, Any]) -> None:
        self.config = Config.model_validate(config_data)
        self._handle = replicas.options(method_name="handle", stream=True)
        self._completions = RateMeter(window_s=10.0)

    def _completed(self) -> None:
        self._completions.record(time.monotonic())

    def _overloaded(self) -> APIError:
        queued = self.config.cluster.max_queued_requests
        rate = self._completions.rate_per_s(time.monotonic())
        retry_s = retry_after_for_backlog(queued, rate, MIN_RETRY_AFTER_S, MAX_RETRY_AFTER_S)
        shown = f"{rate:.3g}/s" if rate > 0 else "no measured rate"
        return rejection_error(Rejection(
            "queue_full", retry_s,
            f"every replica is full and {queued} requests already wait for one (completing "
            f"{shown}); retry in {retry_s:.3g} s"))

    async def __call__(self, request: Request) -> Response:
        try:
            body = await read_body(request, self.config.server.max_body_bytes)
        except APIError as err:
            return err.response()
        hint = route_hint(request.url.path, body, default_model=self.config.default_model,
                          prefix_chars=self.config.cluster.prefix_chars)
        client = request.scope.get("client")
        call = HttpCall(request.method, request.url.path, request.scope.get("query_string", b""),
                        tuple(request.scope.get("headers", ())), body,
                        tuple(client) if client else None)
        for attempt in range(1, ATTEMPTS + 1):
            try:
                parts = cast(PartStream, self._handle.remote(hint, call))
                start = await parts.__anext__()
            except BackPressureError:
                return self._overloaded().response()
            except RayError as exc:  # the replica died before answering: try another
                log.warning("replica failed before answering (%s), attempt %d",
                            type(exc).__name__, attempt)
                if attempt < ATTEMPTS:
                    continue
                return APIError(503, "The replicas failed to answer.", type="server_error",
                                code="replica_failed", retry_after_s=MIN_RETRY_AFTER_S
                                ).response()
            assert isinstance(start, ResponseStart)
            if start.status != 503:
                return RelayResponse(start, [], parts, self._completed)
            refusal = [part async for part in parts]
            replica = start.header("x-sluice-replica")
            if attempt < ATTEMPTS and replica and _error_code(refusal) in RETRYABLE_CODES:
                hint = RouteHint(hint.model_id, hint.prefix_key, hint.exclude | {replica})
                continue
            return RelayResponse(start, refusal, _NoParts(), self._completed)
        raise AssertionError("unreachable")  # every attempt returns or continues


class _NoParts:
    """An empty stand-in for a generator already read to its end."""

    def __aiter__(self) -> _NoParts:
        return self

    async def __anext__(self) -> bytes:
        raise StopAsyncIteration

    def cancel(self) -> None:
        return None


def _error_code(body_parts: list[bytes]) -> str | None:
    try:
        error = json.loads(b"".join(body_parts)).get("error") or {}
    except (ValueError, AttributeError):
        return None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None
