"""ASGI middleware: a request id on every response, and a body size limit (413)."""

from __future__ import annotations

import json
import logging
import re
import uuid
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sluice.server.errors import APIError

log = logging.getLogger("sluice.server")
_ID_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


class _TooLarge(HTTPException):
    """Raised from ``receive`` once a body without Content-Length passes the limit. An
    ``HTTPException`` because FastAPI's body parsing re-raises those and turns any other
    exception into a 400 "error parsing the body"."""

    def __init__(self, max_body_bytes: int) -> None:
        super().__init__(413, f"Request body is larger than {max_body_bytes} bytes")


class GuardMiddleware:
    """Sets ``x-request-id`` (the client's if well-formed, else a new one) and refuses
    bodies over ``max_body_bytes`` with 413, whether announced by Content-Length or not."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"x-request-id", b"").decode("latin-1")
        request_id = given if _ID_RE.match(given) else f"req-{uuid.uuid4().hex}"
        scope.setdefault("state", {})["request_id"] = request_id
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message.setdefault("headers", [])
                message["headers"] = [
                    *message["headers"], (b"x-request-id", request_id.encode())
                ]
            await send(message)

        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            await self._too_large(send_with_id)
            return
        seen = 0

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body_bytes:
                    raise _TooLarge(self.max_body_bytes)
            return message

        try:
            await self.app(scope, counting_receive, send_with_id)
        except _TooLarge:
            if not started:
                await self._too_large(send_with_id)
        except Exception:
            # Starlette's ServerErrorMiddleware sits outside this one: its 500 would lack
            # x-request-id, and uvicorn drops a keep-alive connection after an escaped error.
            if started:
                raise
            log.exception("unhandled error in request %s", request_id)
            internal = APIError(500, "Internal error.", type="server_error", code="internal_error")
            await internal.response()(scope, counting_receive, send_with_id)

    async def _too_large(self, send: Send) -> None:
        body: dict[str, Any] = {
            "error": {
                "message": f"Request body is larger than {self.max_body_bytes} bytes",
                "type": "invalid_request_error",
                "param": None,
                "code": "body_too_large",
            }
        }
        raw = json.dumps(body).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(raw)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": raw})
