"""Every failure of the shared quota store falls back to the local buckets, an unexpected
reply included: over HTTP, with a real ``redis-server`` whose state was tampered with (a
reply carrying an infinite wait) and with a server on the Redis port that answers in the
wrong shape, each request is served (or refused by the local bucket), never a 500, and the
server then serves a plain request."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from tests.server.live import LiveServer, config_with, metric_sum, scrape, synth_chat
from tests.tenants.redisproc import RedisProcess

KEY = {"authorization": "Bearer key-t"}
BODY = {"model": "synth-chat", "prompt": "hi", "max_tokens": 2}


def _server(serve: Callable[..., LiveServer], url: str) -> LiveServer:
    return serve(config_with(
        models=[synth_chat()], workers={"count": 1}, server={"open_metrics": True},
        tenants=[{"id": "t", "api_keys": ["key-t"],
                  "limits": {"requests_per_s": 5, "burst": 5, "max_concurrent": 4}}],
        quota={"backend": "redis", "redis_url": url, "timeout_ms": 500,
               "reconnect_interval_s": 30}))


def test_a_tampered_bucket_whose_reply_is_infinite_falls_back(
        serve: Callable[..., LiveServer], redis: RedisProcess) -> None:
    live = _server(serve, redis.url)
    with live.client(headers=KEY) as c:
        assert c.post("/v1/completions", json=BODY).status_code == 200  # shared, from Redis
        with redis.client() as r:  # the last update "at infinity": every wait is infinite
            [bucket] = r.keys("sluice:quota:{t}:bucket")
            r.hset(bucket, mapping={"rt": "0", "ru": "1e999"})
        first = c.post("/v1/completions", json=BODY)
        assert first.status_code == 200, first.text  # served by the local bucket
        samples = scrape(c)
        assert metric_sum(samples, "sluice_quota_fallback") == 1
        assert metric_sum(samples, "sluice_quota_backend_errors_total") >= 1
        assert c.post("/v1/completions", json=BODY).status_code == 200


class WrongShapeRedis:
    """A server on a loopback port that speaks Redis's protocol (RESP2) and answers every
    command with ``reply``: a stand-in for a proxy or another service on Redis's port."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.commands = 0
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        with conn:
            while True:
                try:
                    chunk = conn.recv(65536)
                except OSError:
                    return
                if not chunk:
                    return
                buf += chunk
                while (done := _command_end(buf)) is not None:
                    buf = buf[done:]
                    self.commands += 1
                    conn.sendall(self.reply)

    def close(self) -> None:
        self.sock.close()


def _command_end(buf: bytes) -> int | None:
    """Where the first complete RESP array of bulk strings in ``buf`` ends (None: not yet)."""
    if not buf.startswith(b"*") or b"\r\n" not in buf:
        return None
    head, pos = buf.split(b"\r\n", 1)[0], buf.index(b"\r\n") + 2
    for _ in range(int(head[1:])):
        end = buf.find(b"\r\n", pos)
        if end == -1:
            return None
        size = int(buf[pos + 1:end])
        pos = end + 2 + size + 2
        if pos > len(buf):
            return None
    return pos


@pytest.fixture(params=[b"*2\r\n:1\r\n:0\r\n", b"+OK\r\n", b"$-1\r\n",
                        b"*6\r\n:1\r\n$0\r\n\r\n$3\r\nnan\r\n$1\r\n1\r\n$1\r\n1\r\n:0\r\n"],
                ids=["short-array", "status", "nil", "nan-wait"])
def wrong_shape(request: pytest.FixtureRequest) -> Iterator[WrongShapeRedis]:
    server = WrongShapeRedis(request.param)
    yield server
    server.close()


def test_a_reply_of_the_wrong_shape_falls_back(serve: Callable[..., LiveServer],
                                               wrong_shape: WrongShapeRedis) -> None:
    live = _server(serve, wrong_shape.url)
    with live.client(headers=KEY) as c:
        for _ in range(3):
            r = c.post("/v1/completions", json=BODY)
            assert r.status_code == 200, r.text
        assert wrong_shape.commands >= 1  # the store did ask it
        samples = scrape(c)
        assert metric_sum(samples, "sluice_quota_fallback") == 1
        assert metric_sum(samples, "sluice_quota_backend_errors_total") >= 1
