"""What a connection may hold of the server: uvicorn's settings from ``[server]`` and an h11
protocol with a deadline on each request head.

uvicorn bounds the idle time after a response (``timeout_keep_alive``) and, with
``limit_concurrency``, the connections and requests at once (a plain 503 past it); it does
not bound a request head sent a byte at a time, nor a connection that never sends one
(uvicorn cancels the keep-alive timer at the first byte). ``HeadTimeoutH11Protocol`` closes a
connection that has not sent a complete request head within ``header_timeout_s`` of
connecting or of its previous response. The body's deadline is ``GuardMiddleware``'s
(``body_timeout_s``: 408).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence
from typing import Any, ClassVar

from uvicorn.protocols.http.h11_impl import H11Protocol

from sluice.config import ServerConfig


class HeadTimeoutH11Protocol(H11Protocol):
    """h11 with a deadline on each request head (``head_timeout_s``). Invariant: the timer is
    armed exactly while the connection waits for a request head (from connecting, and after
    each response), and cancelled once a request is in progress or the connection ends."""

    head_timeout_s: ClassVar[float] = 10.0
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        if self._in_request():
            self._cancel_head_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and not self._in_request():
            self._arm_head_timer()

    def _in_request(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_expired)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_expired(self) -> None:
        self._head_timer = None
        if not self._in_request() and not self.transport.is_closing():
            self.transport.close()


def uvicorn_settings(server: ServerConfig) -> dict[str, Any]:
    """The keyword arguments of ``uvicorn.Config`` that bound connections (``sluice serve``
    and the test servers use the same)."""
    protocol = type("SluiceH11Protocol", (HeadTimeoutH11Protocol,),
                    {"head_timeout_s": server.header_timeout_s})
    return {
        # h11 (named: uvicorn would pick httptools wherever it is installed, which has no
        # bound on the request head's size)
        "http": protocol,
        "h11_max_incomplete_event_size": 64 * 1024,
        "timeout_keep_alive": server.keep_alive_timeout_s,
        "limit_concurrency": server.max_connections,
    }


def bind_sockets(hosts: Sequence[str], port: int, backlog: int = 2048) -> list[socket.socket]:
    """Listening sockets for every host on one port, for uvicorn's ``sockets`` (it binds one
    host itself); port 0 binds a free port on the first host and the same on the others.
    ``OSError`` names the address that cannot be bound."""
    sockets: list[socket.socket] = []
    try:
        for host in hosts:
            family, kind, proto, _, address = socket.getaddrinfo(
                host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # this address only, not every IPv4 one as well
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                raise OSError(f"cannot bind {host} port {port}: {exc.strerror}") from None
            sock.listen(backlog)
            sock.set_inheritable(True)
            port = sock.getsockname()[1]
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


__all__ = ["HeadTimeoutH11Protocol", "bind_sockets", "uvicorn_settings"]
