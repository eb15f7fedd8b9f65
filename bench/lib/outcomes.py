"""Shared by the overload and soak runs: one request's outcome as the client saw it,
classified into exactly one of ok / rejected / expired / failed / cancelled / transport
/ other, a Poisson driver, and the server's ``/metrics`` counters to reconcile against.

The reconciliation is the point: every request sent is counted once by the client, and
the server's ``sluice_requests_total{state}`` must account for the same requests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

KINDS = ("ok", "rejected", "expired", "failed", "cancelled", "transport", "other")
SERVER_STATES = ("completed", "rejected", "expired", "failed", "cancelled")


@dataclass
class Outcome:
    """One request: its class, HTTP status, error code, and times (s from run start)."""

    kind: str
    status: int
    code: str | None
    start_s: float
    latency_s: float
    deadline_s: float | None
    retry_after: str | None = None
    tokens: int = 0
    first_token_s: float | None = None
    """From sending to the first token (a stream's first chunk); None if none came."""
    queue_wait_ms: float | None = None
    """The server's ``x-sluice-queue-wait-ms`` (queued to running), when it answered one."""
    worker: str | None = None
    """The server's ``x-sluice-worker``: which worker ran it."""


async def one_request(
    client: httpx.AsyncClient, base_url: str, model: str, prompt: str, max_tokens: int, *,
    deadline_ms: float | None, t_base: float, cancel_after_s: float | None = None,
    token_log: list[float] | None = None,
) -> Outcome:
    """A streaming ``/v1/completions``; with ``cancel_after_s`` the client walks away that
    long after its first token (so the server has surely admitted it). ``token_log``
    gets each token's arrival (s from ``t_base``)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "stream": True, "ignore_eos": True}
    headers = {} if deadline_ms is None else {"x-sluice-deadline-ms": f"{deadline_ms:.0f}"}
    t0 = time.perf_counter()
    deadline_s = None if deadline_ms is None else deadline_ms / 1000.0
    first_token_s: float | None = None
    resp_headers: httpx.Headers = httpx.Headers()

    def done(kind: str, status: int, code: str | None = None, retry: str | None = None,
             tokens: int = 0) -> Outcome:
        return Outcome(kind, status, code, t0 - t_base, time.perf_counter() - t0, deadline_s,
                       retry, tokens, first_token_s, *decision_of(resp_headers))

    try:
        async with client.stream("POST", f"{base_url}/v1/completions", json=body,
                                 headers=headers) as resp:
            resp_headers = resp.headers
            if resp.status_code != 200:
                await resp.aread()
                code = None
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    code = resp.json()["error"]["code"]
                return done(_kind_of(resp.status_code), resp.status_code, code,
                            resp.headers.get("retry-after"))
            tokens = 0
            cancel_at: float | None = None
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    break
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    code = chunk["error"].get("code")
                    kind = "expired" if code == "deadline" else "failed"
                    return done(kind, 200, code, tokens=tokens)
                tokens += 1
                now_s = time.perf_counter()
                if first_token_s is None:
                    first_token_s = now_s - t0
                if token_log is not None:
                    token_log.append(now_s - t_base)
                if cancel_after_s is not None:
                    if cancel_at is None:
                        cancel_at = now_s + cancel_after_s
                    elif now_s >= cancel_at:
                        return done("cancelled", 200, "client_cancel", tokens=tokens)
            return done("ok", 200, tokens=tokens)
    except httpx.TransportError as exc:
        return done("transport", 0, f"{type(exc).__name__}: {exc}"[:200])


def decision_of(headers: httpx.Headers) -> tuple[float | None, str | None]:
    """(queue wait in ms, worker) from the server's ``x-sluice-*`` headers, where given."""
    wait = headers.get("x-sluice-queue-wait-ms")
    return (None if wait is None else float(wait)), headers.get("x-sluice-worker")


def _kind_of(status: int) -> str:
    if status in (429, 503):
        return "rejected"
    if status == 504:
        return "expired"
    if status >= 500:
        return "failed"
    if status == 499:
        return "cancelled"
    return "other"


def open_loop_client(timeout_s: float) -> httpx.AsyncClient:
    """The client of an open-loop run: room for every request in flight, and idle
    connections expired before uvicorn's 5 s keep-alive closes them (with both at 5 s, a
    POST can go out on a connection the server is closing: a ``ReadError`` seen once in
    683 requests of a chaos run)."""
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=200,
                          keepalive_expiry=2.0)
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout_s, connect=30.0))


async def arrivals(rng: random.Random, *, rate_per_s: float, duration_s: float,
                   t_base: float) -> AsyncIterator[int]:
    """Poisson arrivals at ``rate_per_s`` from ``t_base`` (``time.perf_counter``) until
    ``duration_s``: sleeps until each one, then yields its index (0, 1, ...). Each arrival
    draws one ``rng.expovariate`` before it is yielded, so a caller's own draws in between
    keep a seeded run reproducible."""
    next_s, i = 0.0, 0
    while True:
        next_s += rng.expovariate(rate_per_s)
        if next_s >= duration_s:
            return
        delay = t_base + next_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        yield i
        i += 1


async def poisson(
    base_url: str, model: str, prompts: Sequence[str], *, rate_per_s: float, duration_s: float,
    max_tokens: int, deadline_ms: float | None, seed: int, cancel_fraction: float = 0.0,
    cancel_after_s: tuple[float, float] = (0.05, 1.0),
) -> list[Outcome]:
    """Open loop: Poisson arrivals at ``rate_per_s`` for ``duration_s``; every request
    is awaited to its end (nothing is left in flight)."""
    rng = random.Random(seed)
    async with open_loop_client(600.0) as client:
        tasks: list[asyncio.Task[Outcome]] = []
        t_base = time.perf_counter()
        async for i in arrivals(rng, rate_per_s=rate_per_s, duration_s=duration_s,
                                t_base=t_base):
            cancel = (rng.uniform(*cancel_after_s) if rng.random() < cancel_fraction
                      else None)
            tasks.append(asyncio.create_task(one_request(
                client, base_url, model, prompts[i % len(prompts)], max_tokens,
                deadline_ms=deadline_ms, t_base=t_base, cancel_after_s=cancel)))
        return list(await asyncio.gather(*tasks))


async def closed(
    base_url: str, model: str, prompts: Sequence[str], *, concurrency: int, duration_s: float,
    max_tokens: int,
) -> list[Outcome]:
    """Closed loop for ``duration_s``: ``concurrency`` clients back to back (capacity)."""
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(limits=limits, timeout=600.0) as client:
        t_base = time.perf_counter()
        out: list[Outcome] = []

        async def user(u: int) -> None:
            i = u
            while time.perf_counter() - t_base < duration_s:
                out.append(await one_request(client, base_url, model,
                                             prompts[i % len(prompts)], max_tokens,
                                             deadline_ms=None, t_base=t_base))
                i += concurrency

        await asyncio.gather(*(user(u) for u in range(concurrency)))
        return out


def server_counts(base_url: str, model: str) -> dict[str, float]:
    """``sluice_requests_total`` by state, goodput and rejections with a reason, for one
    model, summed over tenants."""
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    out: defaultdict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("model") != model:
                continue
            if s.name == "sluice_requests_total":
                out[s.labels["state"]] += s.value
            elif s.name == "sluice_goodput_total":
                out["goodput"] += s.value
            elif s.name == "sluice_admitted_total":
                out["admitted"] += s.value
    return {k: out.get(k, 0.0) for k in (*SERVER_STATES, "goodput", "admitted")}


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, int]:
    return {k: round(after[k] - before.get(k, 0.0)) for k in after}


def tally(outcomes: Sequence[Outcome]) -> dict[str, int]:
    counts = Counter(o.kind for o in outcomes)
    return {k: counts.get(k, 0) for k in KINDS}


def rss_kib(pid: int) -> int | None:
    """Resident set size of a process, from /proc (KiB)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_bytes(pid: int) -> int:
    """Resident set size of a live process (bytes); an error if /proc has none."""
    kib = rss_kib(pid)
    if kib is None:
        raise RuntimeError(f"no VmRSS for process {pid}")
    return kib * 1024


def dump(outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    return [asdict(o) for o in outcomes]


def wait_idle(base: str, timeout_s: float = 120.0) -> dict[str, Any]:
    """``/status.json`` once the server at ``base`` holds no request (none live, queued or
    in a worker); ``TimeoutError`` after ``timeout_s``."""
    end = time.monotonic() + timeout_s
    while True:
        status: dict[str, Any] = httpx.get(f"{base}/status.json", timeout=10).json()
        busy = status["live_requests"] or status["queue_depth"] or any(
            w["active"] or w["inbox_depth"] for w in status["workers"])
        if not busy:
            return status
        if time.monotonic() > end:
            raise TimeoutError(f"server still busy: {status}")
        time.sleep(0.2)


def per_second(outcomes: list[dict[str, Any]], bins: int) -> dict[str, list[int]]:
    """Outcomes by arrival second, per kind (what the figure's top row shows)."""
    out: dict[str, list[int]] = {}
    for o in outcomes:
        out.setdefault(o["kind"], [0] * bins)[min(bins - 1, int(o["start_s"]))] += 1
    return out
