"""Load generation over HTTP against any OpenAI-compatible server (sluice, llama-server):
closed-loop (fixed concurrency) and open-loop (Poisson arrivals), streaming completions,
per-request TTFT / TPOT, and summaries. Bounded in requests and time; loopback only."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from bench.lib.sse_client import post_sse


@dataclass
class Sample:
    """One request's outcome as the client saw it."""

    status: int
    start_s: float
    latency_s: float
    ttft_s: float | None = None
    tpot_s: float | None = None
    tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None
    retry_after: str | None = None
    itl_cv: float | None = None
    """Coefficient of variation of the gaps between its tokens (None under 3 tokens)."""
    token_times: list[float] | None = None
    """``perf_counter`` instants its tokens arrived (streams that ran to the end)."""

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None


def _completion_body(model: str, prompt: str, max_tokens: int, ignore_eos: bool
                     ) -> dict[str, Any]:
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "stream": True, "ignore_eos": ignore_eos}


class _Tally:
    """One streamed completion's tokens as its SSE ``data:`` payloads arrive: the instant
    of each chunk with text, the finish reason, or the error chunk that ended it."""

    def __init__(self, t0: float, on_token: Callable[[], object] | None) -> None:
        self.t0 = t0
        self.times: list[float] = []
        self.finish: str | None = None
        self.error: Sample | None = None
        self._on_token = on_token

    def feed(self, payload: bytes, arrived: float) -> bool:
        """Count one payload that arrived at ``arrived``; False once an error ended it."""
        if payload == b"[DONE]":
            return True
        chunk = json.loads(payload)
        if "error" in chunk:
            self.error = Sample(status=200, start_s=self.t0,
                                latency_s=time.perf_counter() - self.t0,
                                error=str(chunk["error"])[:200])
            return False
        for choice in chunk.get("choices", []):
            if choice.get("text"):
                self.times.append(arrived)
                if self._on_token is not None:
                    self._on_token()
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
        return True

    def failed(self, exc: BaseException) -> Sample:
        """The request ended by a transport error (no answer, or a cut stream)."""
        return Sample(status=0, start_s=self.t0, latency_s=time.perf_counter() - self.t0,
                      error=f"{type(exc).__name__}: {exc}"[:200])

    def refused(self, status: int, body: str, retry_after: str | None) -> Sample:
        """The request answered with ``status`` (not 200) and ``body``."""
        return Sample(status=status, start_s=self.t0, latency_s=time.perf_counter() - self.t0,
                      error=body[:200], retry_after=retry_after)

    def sample(self) -> Sample:
        if self.error is not None:
            return self.error
        end, times = time.perf_counter(), self.times
        ttft = times[0] - self.t0 if times else None
        tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None
        gaps = [b - a for a, b in itertools.pairwise(times)]
        itl_cv = (statistics.pstdev(gaps) / statistics.fmean(gaps)
                  if len(gaps) >= 2 and statistics.fmean(gaps) > 0 else None)
        return Sample(status=200, start_s=self.t0, latency_s=end - self.t0, ttft_s=ttft,
                      tpot_s=tpot, tokens=len(times), finish_reason=self.finish,
                      itl_cv=itl_cv, token_times=times)


async def stream_completion(
    client: httpx.AsyncClient,
    base_url: str,
    model: str,
    prompt: str,
    max_tokens: int,
    *,
    ignore_eos: bool = True,
    headers: dict[str, str] | None = None,
    timeout_s: float = 300.0,
    on_token: Callable[[], object] | None = None,
) -> Sample:
    """POST /v1/completions with stream=true; time the first and every later chunk (the
    instant its line was read). ``on_token`` is called after each token is timed (a bench
    adding client work)."""
    body = _completion_body(model, prompt, max_tokens, ignore_eos)
    tally = _Tally(time.perf_counter(), on_token)
    try:
        async with client.stream("POST", f"{base_url}/v1/completions", json=body,
                                 headers=headers, timeout=timeout_s) as resp:
            if resp.status_code != 200:
                await resp.aread()
                return tally.refused(resp.status_code, resp.text,
                                     resp.headers.get("retry-after"))
            async for line in resp.aiter_lines():
                if line.startswith("data:") and not tally.feed(
                        line[5:].strip().encode(), time.perf_counter()):
                    break
    except (httpx.HTTPError, OSError) as exc:
        return tally.failed(exc)
    return tally.sample()


async def raw_stream_completion(
    base_url: str,
    model: str,
    prompt: str,
    max_tokens: int,
    *,
    ignore_eos: bool = True,
    headers: dict[str, str] | None = None,
    timeout_s: float = 300.0,
    on_token: Callable[[], object] | None = None,
) -> Sample:
    """``stream_completion`` through ``bench.lib.sse_client`` (no httpx): the same request and
    ``Sample``, each token timed at the instant the read that completed its line returned,
    for about a fifth of the client CPU a token."""
    body = json.dumps(_completion_body(model, prompt, max_tokens, ignore_eos)).encode()
    tally = _Tally(time.perf_counter(), on_token)
    try:
        answer = await post_sse(f"{base_url}/v1/completions", body, tally.feed,
                                headers=headers, timeout_s=timeout_s)
    except OSError as exc:  # ConnectionError and TimeoutError among them
        return tally.failed(exc)
    if answer.status != 200:
        return tally.refused(answer.status, answer.body.decode("utf-8", "replace"),
                             answer.headers.get("retry-after"))
    return tally.sample()


async def closed_loop(
    base_url: str, model: str, prompts: Sequence[str], *, concurrency: int, n_requests: int,
    max_tokens: int, raw_client: bool = False, tag: str | None = None, **kw: Any,
) -> tuple[list[Sample], float]:
    """``concurrency`` clients each send back-to-back until ``n_requests`` are done
    (``raw_client``: through ``raw_stream_completion``). Samples in the order the
    requests ended; with ``tag``, request ``i`` carries ``x-request-id: <tag>-<i>`` (its
    access-log line) and the samples are in request order (``samples[i]``)."""
    counter = iter(range(n_requests))
    ended: list[Sample] = []
    ordered: list[Sample | None] = [None] * n_requests
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(limits=limits) as client:

        async def user() -> None:
            for i in counter:
                opts = kw if tag is None else {
                    **kw, "headers": {**(kw.get("headers") or {}), "x-request-id": f"{tag}-{i}"}}
                prompt = prompts[i % len(prompts)]
                sample = await (
                    raw_stream_completion(base_url, model, prompt, max_tokens, **opts)
                    if raw_client
                    else stream_completion(client, base_url, model, prompt, max_tokens, **opts))
                ended.append(sample)
                ordered[i] = sample

        t0 = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
        return (ended if tag is None else [s for s in ordered if s is not None]), wall


CUT_ERROR = "cut: unfinished at the run's wall bound"
"""``Sample.error`` of a request still open when an open-loop run hit ``max_wall_s``."""


async def open_loop(
    base_url: str, model: str, prompts: Sequence[str], *, rate_per_s: float, n_requests: int,
    max_tokens: int, seed: int = 0, max_wall_s: float | None = None,
    raw_client: bool = False, **kw: Any,
) -> tuple[list[Sample], float]:
    """Poisson arrivals at ``rate_per_s`` (seeded), ``n_requests`` in all.

    With ``max_wall_s`` the run ends by then: requests still open are cancelled (their
    connection closed, as a client giving up) and returned as failed samples with
    ``CUT_ERROR``; every request yields exactly one sample either way. ``raw_client``:
    through ``raw_stream_completion``."""
    rng = random.Random(seed)
    gaps = [rng.expovariate(rate_per_s) for _ in range(n_requests)]
    limits = httpx.Limits(max_connections=n_requests + 4)
    async with httpx.AsyncClient(limits=limits) as client:
        tasks: list[asyncio.Task[Sample]] = []
        starts: list[float] = []
        t0 = time.perf_counter()
        for i, gap in enumerate(gaps):
            await asyncio.sleep(gap)
            starts.append(time.perf_counter())
            tasks.append(asyncio.create_task(
                raw_stream_completion(base_url, model, prompts[i % len(prompts)], max_tokens,
                                      **kw) if raw_client
                else stream_completion(client, base_url, model, prompts[i % len(prompts)],
                                       max_tokens, **kw)))
        timeout = (None if max_wall_s is None
                   else max(0.0, max_wall_s - (time.perf_counter() - t0)))
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        end = time.perf_counter()
        samples = [task.result() if task not in pending
                   else Sample(status=0, start_s=start, latency_s=end - start, error=CUT_ERROR)
                   for task, start in zip(tasks, starts, strict=True)]
        return samples, end - t0


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summarize(samples: Sequence[Sample], wall_s: float, *, ttft_slo_s: float,
              tpot_slo_s: float) -> dict[str, Any]:
    """Throughput, latency percentiles and goodput (requests meeting both SLOs)."""
    ok = [s for s in samples if s.ok]
    ttft = [s.ttft_s for s in ok if s.ttft_s is not None]
    tpot = [s.tpot_s for s in ok if s.tpot_s is not None]
    good = [s for s in ok if s.ttft_s is not None and s.ttft_s <= ttft_slo_s
            and (s.tpot_s is None or s.tpot_s <= tpot_slo_s)]
    return {
        "requests": len(samples),
        "ok": len(ok),
        "errors": len(samples) - len(ok),
        "wall_s": round(wall_s, 3),
        "tokens": sum(s.tokens for s in ok),
        "tokens_per_s": sum(s.tokens for s in ok) / wall_s if wall_s > 0 else 0.0,
        "requests_per_s": len(ok) / wall_s if wall_s > 0 else 0.0,
        "ttft_p50_s": percentile(ttft, 0.5),
        "ttft_p95_s": percentile(ttft, 0.95),
        "tpot_p50_s": percentile(tpot, 0.5),
        "tpot_p95_s": percentile(tpot, 0.95),
        "goodput_requests": len(good),
        "goodput_per_s": len(good) / wall_s if wall_s > 0 else 0.0,
        "mean_tpot_s": statistics.fmean(tpot) if tpot else None,
    }


def dump_samples(samples: Sequence[Sample]) -> list[dict[str, Any]]:
    return [{k: v for k, v in asdict(s).items() if k != "token_times"} for s in samples]
