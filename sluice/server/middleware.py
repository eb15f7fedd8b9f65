"""ASGI middleware: a request id on every response, a body size limit (413) and deadline
(408), a tenant past its request rate refused before its body is read (429), and the access
log (one line per request)."""

from __future__ import annotations

import asyncio
import logging
import re
import uuid

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sluice.server import access
from sluice.server.auth import TENANT_STATE
from sluice.server.errors import APIError, error_response, request_timeout

log = logging.getLogger("sluice.server")
_ID_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


def request_id_from(given: str | None) -> str:
    """The client's request id if well-formed, else a new one."""
    return given if given and _ID_RE.match(given) else f"req-{uuid.uuid4().hex}"


class _TooLarge(HTTPException):
    """Raised from ``receive`` once a body without Content-Length passes the limit. An
    ``HTTPException`` because FastAPI's body parsing re-raises those and turns any other
    exception into a 400 "error parsing the body"."""

    def __init__(self, max_body_bytes: int) -> None:
        super().__init__(413, f"Request body is larger than {max_body_bytes} bytes")


class _SlowBody(HTTPException):
    """Raised from ``receive`` when a body has not arrived whole by its deadline (an
    ``HTTPException`` for the reason ``_TooLarge`` is one)."""

    def __init__(self, body_timeout_s: float) -> None:
        super().__init__(408, f"The request body did not arrive within {body_timeout_s:g} s")


class GuardMiddleware:
    """Sets ``x-request-id`` (the client's if well-formed, else a new one), refuses bodies
    over ``max_body_bytes`` with 413, whether announced by Content-Length or not, and a body
    that has not arrived whole ``body_timeout_s`` after its head with 408 (a client sending
    a byte every few seconds holds nothing longer). Waiting for the client's disconnect once
    the body is in (a stream watching for it) has no deadline."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, body_timeout_s: float = 30.0) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"x-request-id", b"").decode("latin-1")
        request_id = request_id_from(given)
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
        path = str(scope.get("path", ""))
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            await self._too_large(scope, receive, send_with_id)
            return
        seen = 0
        body_done = False
        body_due = asyncio.get_running_loop().time() + self.body_timeout_s

        async def counting_receive() -> Message:
            nonlocal seen, body_done
            if body_done:
                return await receive()
            left_s = body_due - asyncio.get_running_loop().time()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, left_s))
            except TimeoutError:
                raise _SlowBody(self.body_timeout_s) from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body_bytes:
                    raise _TooLarge(self.max_body_bytes)
                body_done = not message.get("more_body", False)
            else:
                body_done = True
            return message

        try:
            await self.app(scope, counting_receive, send_with_id)
        except _TooLarge:
            if not started:
                await self._too_large(scope, receive, send_with_id)
        except _SlowBody as exc:
            if not started:
                await error_response(request_timeout(str(exc.detail)), path)(
                    scope, receive, send_with_id)
        except Exception:
            # Starlette's ServerErrorMiddleware sits outside this one: its 500 would lack
            # x-request-id, and uvicorn drops a keep-alive connection after an escaped error.
            if started:
                raise
            log.exception("unhandled error in request %s", request_id)
            internal = APIError(500, "Internal error.", type="server_error", code="internal_error")
            await error_response(internal, path)(scope, counting_receive, send_with_id)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        err = APIError(413, f"Request body is larger than {self.max_body_bytes} bytes",
                       code="body_too_large")
        await error_response(err, str(scope.get("path", "")))(scope, receive, send)


class QuotaPeekMiddleware:
    """A POST from a tenant whose request bucket is empty by this replica's last word from
    the quota store (``QuotaGate.refusal_before_body``) gets its 429, in the shape of the
    API its path belongs to, without its body being read or parsed: a client past its rate
    costs the server a header lookup, not the parse of up to ``max_body_bytes`` of JSON.
    Everything else (a bad key included, whose 401 the route gives) passes through, with the
    tenant it resolved left in the scope's state for the route (``Auth.tenant``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        if (scope["type"] != "http" or scope.get("method") != "POST"
                or path.startswith("/admin")):
            await self.app(scope, receive, send)
            return
        ctx = scope["app"].state.ctx
        headers = {k.decode("latin-1"): v.decode("latin-1")
                   for k, v in scope.get("headers", ())}
        try:
            tenant = ctx.auth.tenant_from_headers(headers)
        except APIError:
            await self.app(scope, receive, send)
            return
        scope.setdefault("state", {})[TENANT_STATE] = tenant
        refusal = ctx.quota.refusal_before_body(tenant.id, ctx.runtime.new_request_id)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        await error_response(refusal, path)(scope, receive, send)


class AccessLogMiddleware:
    """One access line per HTTP request (``sluice.server.access``), written when the
    response has been sent (or the connection ended). Outermost, so it sees every answer,
    413s and 500s included; the request id is the one ``GuardMiddleware`` chose."""

    def __init__(self, app: ASGIApp, log_content: bool = False) -> None:
        self.app = app
        self.log_content = log_content

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = access.begin("", "http", scope.get("method", ""), scope.get("path", ""))
        status = 0

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            record.request_id = str(scope.get("state", {}).get("request_id", ""))
            access.emit(record, status or 500, log_content=self.log_content)
