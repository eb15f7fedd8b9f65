"""A lean streaming HTTP/1.1 client for the load generator: one POST, its answer read by
an asyncio ``Protocol`` whose ``data_received`` de-chunks the body and splits SSE lines
itself, with no coroutine, stream object or text decoding a token.

Why: the load generator shares the 2 cores with the server under test, and on this host
each millisecond of its CPU delays a decode step by about a millisecond
(``bench/micro/engine_overhead.py --servers``); httpx spends about 0.2 ms of CPU a
streamed token. Loopback, plain HTTP, one connection a request (``Connection: close``),
bodies chunked or sized.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast
from urllib.parse import urlsplit


@dataclass
class RawAnswer:
    """What came back: the status, the headers (lower-case names), and for a non-200 the
    body. Each SSE ``data:`` payload went to ``on_data`` with its arrival instant."""

    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


class _SSEProtocol(asyncio.Protocol):
    """Parses one response as its bytes arrive. Invariant: ``_buf`` holds only bytes not
    yet parsed: in the head, a chunk's size line, a chunk's data, or a partial SSE line
    (``_line``)."""

    def __init__(self, request: bytes, on_data: Callable[[bytes, float], bool]) -> None:
        self._request = request
        self._on_data = on_data
        self._buf = b""
        self._line = b""
        self._head_done = False
        self._chunked = False
        self._left: int | None = None  # bytes left: of the sized body, or of this chunk
        self._skip = 0  # bytes of a chunk's closing CRLF still to drop
        self._transport: asyncio.Transport | None = None
        self.answer = RawAnswer()
        self.done: asyncio.Future[RawAnswer] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self._transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        if self.done.done():
            return
        arrived = time.perf_counter()
        self._buf += data
        if not self._head_done and not self._parse_head():
            return
        if self.answer.status != 200:
            self._collect_body()
        elif self._chunked:
            self._dechunk(arrived)
        else:
            self._feed(self._take_sized(), arrived)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done.done():
            return
        if self._head_done and not self._chunked and self._left is None:
            self._finish()  # a body delimited by the connection's end
        else:
            self.done.set_exception(exc or ConnectionError("connection closed mid-answer"))

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def _parse_head(self) -> bool:
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            return False
        lines = self._buf[:end].decode("latin-1").split("\r\n")
        self._buf = self._buf[end + 4:]
        self.answer.status = int(lines[0].split(" ", 2)[1])
        for line in lines[1:]:
            name, _, value = line.partition(":")
            self.answer.headers[name.strip().lower()] = value.strip()
        self._chunked = "chunked" in self.answer.headers.get("transfer-encoding", "").lower()
        if not self._chunked and "content-length" in self.answer.headers:
            self._left = int(self.answer.headers["content-length"])
        self._head_done = True
        return True

    def _take_sized(self) -> bytes:
        data, self._buf = self._buf, b""
        if self._left is not None:
            data = data[: self._left]
            self._left -= len(data)
            if self._left == 0:
                self._finish()
        return data

    def _collect_body(self) -> None:
        if self._chunked:
            self._dechunk(0.0, collect=True)
        else:
            self.answer.body += self._take_sized()

    def _dechunk(self, arrived: float, collect: bool = False) -> None:
        while not self.done.done():
            if self._skip:  # the CRLF after a chunk's data
                cut = min(self._skip, len(self._buf))
                self._buf, self._skip = self._buf[cut:], self._skip - cut
                if self._skip:
                    return
            if self._left is None:  # at a size line
                end = self._buf.find(b"\r\n")
                if end < 0:
                    return
                size = int(self._buf[:end].split(b";", 1)[0], 16)
                self._buf = self._buf[end + 2:]
                if size == 0:
                    self._finish()
                    return
                self._left = size
            if not self._buf:
                return
            data, self._buf = self._buf[: self._left], self._buf[self._left:]
            self._left -= len(data)
            if self._left == 0:
                self._left, self._skip = None, 2
            if collect:
                self.answer.body += data
            else:
                self._feed(data, arrived)

    def _feed(self, data: bytes, arrived: float) -> None:
        """Hand every complete SSE ``data:`` line in ``data`` to ``on_data``; it returns
        False to stop reading (the answer ends there)."""
        *lines, self._line = (self._line + data).split(b"\n")
        for line in lines:
            if line.startswith(b"data:") and not self._on_data(line[5:].strip(), arrived):
                self._finish()
                return

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(self.answer)
        self.close()


async def post_sse(url: str, body: bytes, on_data: Callable[[bytes, float], bool], *,
                   headers: dict[str, str] | None = None,
                   timeout_s: float = 300.0) -> RawAnswer:
    """POST ``body`` (JSON) to ``url`` and read the answer; each SSE ``data:`` payload of a
    200 goes to ``on_data(payload, arrival perf_counter)`` as its line completes (False from
    it ends the read). Raises ``OSError``/``ConnectionError`` on a broken connection and
    ``TimeoutError`` past ``timeout_s``; cancelling closes the connection."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    request = (f"POST {parts.path or '/'} HTTP/1.1\r\nHost: {host}:{port}\r\n"
               f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
               f"Content-Length: {len(body)}\r\nConnection: close\r\n{extra}\r\n"
               ).encode("latin-1") + body
    loop = asyncio.get_running_loop()
    _, protocol = await asyncio.wait_for(loop.create_connection(
        lambda: _SSEProtocol(request, on_data), host, port), timeout_s)
    try:
        return await asyncio.wait_for(asyncio.shield(protocol.done), timeout_s)
    finally:
        protocol.close()
