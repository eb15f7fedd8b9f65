"""Slow and idle clients against a real uvicorn server (raw sockets on 127.0.0.1): a request
head sent a byte at a time, a connection that never sends one, a body that trickles, an idle
keep-alive connection and more connections than the cap each hold the server no longer than
``[server]`` allows; after each, a real request is served."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import httpx

from tests.server.live import LiveServer, config_with

CHAT = "synth-chat"
BODY = b'{"model": "synth-chat", "prompt": "hi", "max_tokens": 2}'


def _serve(serve: Callable[..., LiveServer], **server: object) -> LiveServer:
    return serve(config_with(server=server))


def _connect(live: LiveServer) -> socket.socket:
    host, port = live.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def _closed_within(sock: socket.socket, seconds: float) -> bytes | None:
    """What the server sent before it closed the connection, or None if it was still open
    after ``seconds``."""
    sock.settimeout(0.1)
    got = b""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return got
        if not chunk:
            return got
        got += chunk
    return None


def _served(live: LiveServer) -> None:
    r = httpx.post(f"{live.url}/v1/completions", content=BODY,
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 200, r.text


def test_a_head_sent_a_byte_at_a_time_is_cut_off(serve: Callable[..., LiveServer]) -> None:
    live = _serve(serve, header_timeout_s=0.5)
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    with _connect(live) as sock:
        start = time.monotonic()
        try:
            for byte in head:  # a byte every 50 ms: never a whole head within 0.5 s
                sock.sendall(bytes([byte]))
                time.sleep(0.05)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed while the head was still coming
        else:
            raise AssertionError("the whole head was taken")
        assert _closed_within(sock, 5.0) is not None
        assert time.monotonic() - start < 5.0
    _served(live)


def test_a_connection_that_sends_nothing_is_closed(serve: Callable[..., LiveServer]) -> None:
    live = _serve(serve, header_timeout_s=0.5)
    with _connect(live) as sock:
        assert _closed_within(sock, 5.0) == b""
    _served(live)


def test_a_trickling_body_gets_408(serve: Callable[..., LiveServer]) -> None:
    live = _serve(serve, body_timeout_s=0.5)
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(BODY))
    with _connect(live) as sock:
        sock.sendall(head)
        for byte in BODY[:3]:  # three bytes in 0.3 s, then nothing: not whole by 0.5 s
            sock.sendall(bytes([byte]))
            time.sleep(0.1)
        answer = _closed_within(sock, 5.0)  # the 408, then the connection closes
    assert answer is not None and answer.startswith(b"HTTP/1.1 408"), answer
    assert b"request_timeout" in answer
    _served(live)


def test_an_idle_keep_alive_connection_is_closed(serve: Callable[..., LiveServer]) -> None:
    live = _serve(serve, keep_alive_timeout_s=0.5)
    request = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n" % len(BODY)) + BODY
    with _connect(live) as sock:
        sock.sendall(request)
        answer = _closed_within(sock, 5.0)
    assert answer is not None and answer.startswith(b"HTTP/1.1 200"), answer
    _served(live)


def test_connections_past_the_cap_get_503(serve: Callable[..., LiveServer]) -> None:
    live = _serve(serve, max_connections=2, header_timeout_s=30.0)
    held = [_connect(live), _connect(live)]
    try:
        time.sleep(0.2)  # both accepted and counted
        r = httpx.post(f"{live.url}/v1/completions", content=BODY,
                       headers={"content-type": "application/json"}, timeout=10)
        assert r.status_code == 503
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.2)
    _served(live)
