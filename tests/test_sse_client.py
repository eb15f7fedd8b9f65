"""The load generator's lean SSE client against a scripted HTTP/1.1 server: chunk and
line boundaries anywhere, non-200 answers, error chunks and a broken connection; and the
same ``Sample`` as the httpx reader on the same answer."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable

import httpx
import pytest

from bench.lib.loadgen import Sample, raw_stream_completion, stream_completion

Reply = Callable[[asyncio.StreamWriter, dict[str, object]], Awaitable[None]]


def _event(text: str, finish: str | None = None) -> bytes:
    chunk = {"choices": [{"text": text, "index": 0, "finish_reason": finish}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def _chunked(body: bytes, cuts: list[int]) -> list[bytes]:
    """``body`` as HTTP chunks of the sizes between ``cuts``, then the last chunk."""
    out, start = [], 0
    for end in [*cuts, len(body)]:
        if end > start:
            out.append(b"%x\r\n" % (end - start) + body[start:end] + b"\r\n")
        start = end
    return [*out, b"0\r\n\r\n"]


async def _serve(reply: Reply, run: Callable[[str], Awaitable[Sample]]) -> Sample:
    """Run ``run(base_url)`` against a server answering each request with ``reply``."""

    handlers: list[asyncio.Task[object]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.append(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length"))
            body = json.loads(await reader.readexactly(length))
            assert head.startswith(b"POST /v1/completions HTTP/1.1")
            await reply(writer, body)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        sample = await run(f"http://127.0.0.1:{port}")
        await asyncio.gather(*handlers)
    return sample


def _both(reply: Reply) -> tuple[Sample, Sample]:
    """The lean client's sample and httpx's, each against its own run of ``reply``."""

    async def lean(base: str) -> Sample:
        return await raw_stream_completion(base, "m", "hi", 5, timeout_s=10)

    async def with_httpx(base: str) -> Sample:
        async with httpx.AsyncClient() as client:
            return await stream_completion(client, base, "m", "hi", 5, timeout_s=10)

    return asyncio.run(_serve(reply, lean)), asyncio.run(_serve(reply, with_httpx))


STREAM = b"".join([_event("a"), _event(""), _event("b"), _event("c"), _event("d"),
                   _event("e", "length")]) + b"data: [DONE]\n\n"


@pytest.mark.parametrize("cuts", [[], [1, 2, 3, 50, 51, 52, 140], list(range(1, 400, 7))])
def test_tokens_and_finish_whatever_the_chunk_boundaries(cuts: list[int]) -> None:
    async def reply(writer: asyncio.StreamWriter, body: dict[str, object]) -> None:
        assert body["stream"] is True and body["max_tokens"] == 5
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")
        for piece in _chunked(STREAM, cuts):
            for half in (piece[:3], piece[3:]):  # a size line split across reads
                writer.write(half)
                await writer.drain()
                await asyncio.sleep(0.002)

    lean, reference = _both(reply)
    for sample in (lean, reference):
        assert sample.ok, sample.error
        assert (sample.tokens, sample.finish_reason) == (5, "length")  # "" is no token
        assert sample.token_times == sorted(sample.token_times or [])
        assert sample.ttft_s is not None and sample.tpot_s is not None


def test_a_refusal_keeps_its_status_body_and_retry_after() -> None:
    async def reply(writer: asyncio.StreamWriter, body: dict[str, object]) -> None:
        text = b'{"error": {"code": "overloaded"}}'
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 2\r\n"
                     b"content-length: %d\r\n\r\n" % len(text) + text)
        await writer.drain()

    lean, reference = _both(reply)
    for sample in (lean, reference):
        assert (sample.status, sample.retry_after, sample.ok) == (503, "2", False)
        assert sample.error is not None and "overloaded" in sample.error


def test_an_error_chunk_ends_the_stream_as_an_error() -> None:
    async def reply(writer: asyncio.StreamWriter, body: dict[str, object]) -> None:
        events = _event("a") + b'data: {"error": {"message": "worker died"}}\n\n'
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                     + b"".join(_chunked(events, [])))
        await writer.drain()

    lean, reference = _both(reply)
    for sample in (lean, reference):
        assert sample.status == 200 and not sample.ok
        assert sample.error is not None and "worker died" in sample.error


def test_a_connection_cut_mid_answer_is_a_failed_sample() -> None:
    async def reply(writer: asyncio.StreamWriter, body: dict[str, object]) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                     + _chunked(_event("a"), [])[0])  # no last chunk
        await writer.drain()

    lean, reference = _both(reply)
    for sample in (lean, reference):
        assert sample.status == 0 and not sample.ok
