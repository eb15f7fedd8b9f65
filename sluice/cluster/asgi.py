"""One buffered HTTP request through an ASGI app, its response as a stream of parts.

A replica runs sluice's own FastAPI app (routes, errors, quota gate, decision headers) on
each request the front end hands it, so the cluster has no second API: ``call_asgi`` feeds
the app the request and yields what the app sends — a ``ResponseStart`` then the body
chunks as they come (SSE events one by one). A consumer that stops early (the client went
away, the front end was cancelled) makes the app see ``http.disconnect``, which cancels the
sluice request behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("sluice.cluster")

Headers = tuple[tuple[bytes, bytes], ...]

APP_EXIT_TIMEOUT_S = 5.0
"""How long an app that was told of a disconnect gets to finish before it is cancelled."""


@dataclass(frozen=True)
class HttpCall:
    """An HTTP request, read whole by the front end (its body is bounded there)."""

    method: str
    path: str
    query_string: bytes = b""
    headers: Headers = ()
    """Lower-case names, as ASGI has them."""
    body: bytes = b""
    client: tuple[str, int] | None = None


@dataclass(frozen=True)
class ResponseStart:
    """The status line and headers; the body parts follow as ``bytes``."""

    status: int
    headers: Headers

    def header(self, name: str) -> str | None:
        key = name.lower().encode()
        return next((v.decode("latin-1") for k, v in self.headers if k == key), None)


def _scope(call: HttpCall) -> dict[str, Any]:
    path = call.path or "/"
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": call.method.upper(),
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": call.query_string,
        "root_path": "",
        "headers": [(k.lower(), v) for k, v in call.headers],
        "client": call.client,
        "server": ("sluice-replica", 80),
        "state": {},
    }


async def call_asgi(app: Any, call: HttpCall,
                    extra_headers: Sequence[tuple[bytes, bytes]] = ()
                    ) -> AsyncIterator[ResponseStart | bytes]:
    """Run ``app`` on ``call``; yield its ``ResponseStart`` (with ``extra_headers`` added),
    then its non-empty body chunks. An app that ends without a response yields a 500."""
    out: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    gone = asyncio.Event()
    body_given = False

    async def receive() -> dict[str, Any]:
        nonlocal body_given
        if not body_given:
            body_given = True
            return {"type": "http.request", "body": call.body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        await out.put(message)

    async def run() -> None:
        try:
            await app(_scope(call), receive, send)
        except Exception:  # the app's own handlers answered already, when they could
            log.exception("request %s %s failed in the app", call.method, call.path)
        finally:
            await out.put(None)

    task = asyncio.create_task(run())
    started = False
    try:
        while (message := await out.get()) is not None:
            if message["type"] == "http.response.start":
                started = True
                headers = tuple((bytes(k), bytes(v)) for k, v in message.get("headers", ()))
                yield ResponseStart(int(message["status"]), headers + tuple(extra_headers))
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    yield bytes(message["body"])
                if not message.get("more_body", False):
                    break
        if not started:
            yield ResponseStart(500, ((b"content-type", b"application/json"),
                                      *extra_headers))
            yield (b'{"error":{"message":"The server failed to answer.","type":"server_error",'
                   b'"param":null,"code":"internal_error"}}')
    finally:
        gone.set()
        if not task.done():
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(task), APP_EXIT_TIMEOUT_S)
        if not task.done():
            task.cancel()
