"""Slow and idle clients: can connections that never finish a request hold the server, or
slow down the requests of clients that do?

One ``sluice serve`` on the packaged Gemma 3 270M with the shipped ``[server]`` connection
limits (``header_timeout_s`` 10, ``body_timeout_s`` 30, ``keep_alive_timeout_s`` 5,
``max_connections`` 512). Two clients run a closed loop of short greedy completions, first
alone (the baseline), then beside ``--slow`` hostile connections of four kinds, a quarter
each: a request head sent a byte a second (never finished), a body sent a byte a second
(never finished), a connection that sends nothing, and a connection kept alive and idle
after one answered ``/health``. The report gives the normal clients' latency p50/p95 in both
phases and their ratio, the server's open sockets and RSS at the peak and after, and for
each kind how long the server held it and how it ended it (closed, 408, 503 past the cap).

Goals: the normal clients' p95 within 1.5x of the baseline, every hostile connection ended
by the server within its limit plus 2 s, and the server's open sockets back to the
baseline once they are gone.

    python bench/slow_clients.py               # about 2 minutes
    python bench/slow_clients.py --quick       # a smoke run

Writes bench/results/slow_clients.json and .png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from bench.lib.loadgen import percentile
from bench.lib.model_tables import GEMMA, gemma_table, server_tables
from bench.lib.outcomes import rss_bytes
from bench.lib.servers import free_port, running, sluice_cmd

RESULTS = Path(__file__).resolve().parent / "results"
HEADER_TIMEOUT_S, BODY_TIMEOUT_S, KEEP_ALIVE_S = 10.0, 30.0, 5.0
KINDS = {  # kind: the server's limit on it, seconds
    "trickled head": HEADER_TIMEOUT_S,
    "trickled body": BODY_TIMEOUT_S,
    "silent": HEADER_TIMEOUT_S,
    "idle keep-alive": KEEP_ALIVE_S,
}
BODY = {"model": GEMMA, "prompt": "The capital of France is", "max_tokens": 8,
        "temperature": 0}


def config_toml() -> str:
    return (server_tables(GEMMA, queue=64, inbox=32, budget_bytes=4_000_000_000)
            + gemma_table(n_seq_max=8))


@dataclass
class Held:
    """One hostile connection: how long the server let it live and how it ended it."""

    kind: str
    held_s: float | None = None  # None: still open when the bench gave up on it
    ended_by: str = "open"


def open_sockets(pid: int) -> int:
    """File descriptors of process ``pid`` that are sockets."""
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            count += os.readlink(fd).startswith("socket:")
        except OSError:
            continue
    return count


async def hostile(kind: str, port: int, give_up_s: float) -> Held:
    """Open one connection of ``kind`` and feed it as a slow client would until the server
    ends it (EOF, reset, or an answer) or ``give_up_s`` passes."""
    held = Held(kind)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        held.held_s, held.ended_by = 0.0, "refused"
        return held
    t0 = time.monotonic()
    head = ("POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
            "content-type: application/json\r\n")
    if kind == "idle keep-alive":  # one cheap request, then nothing
        writer.write(b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        await writer.drain()
        await read_response(reader)
        t0 = time.monotonic()  # the keep-alive limit runs from the response
    elif kind == "trickled body":
        writer.write(f"{head}content-length: 1000\r\n\r\n{{".encode())
    elif kind == "trickled head":
        writer.write(head.encode())
    feed = {"trickled head": b"x", "trickled body": b" "}.get(kind)
    try:
        while time.monotonic() - t0 < give_up_s:
            if feed is not None:
                writer.write(feed)
                await writer.drain()
            try:
                data = await asyncio.wait_for(reader.read(4096), timeout=1.0)
            except TimeoutError:
                continue
            held.held_s = time.monotonic() - t0
            held.ended_by = ("closed" if not data
                             else data.split(b"\r\n", 1)[0].decode(errors="replace")[9:12])
            return held
    except (ConnectionError, OSError):
        held.held_s, held.ended_by = time.monotonic() - t0, "reset"
        return held
    finally:
        writer.close()
    return held


async def read_response(reader: asyncio.StreamReader) -> None:
    """Read one HTTP/1.1 response with a content-length (``/health``'s)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    await reader.readexactly(length)


async def normal_loop(client: httpx.AsyncClient, url: str, until_s: float,
                      latencies_s: list[float], failures: dict[str, int]) -> None:
    while time.monotonic() < until_s:
        t0 = time.perf_counter()
        try:
            r = await client.post(f"{url}/v1/completions", json=BODY)
        except httpx.HTTPError as exc:
            failures[type(exc).__name__] = failures.get(type(exc).__name__, 0) + 1
            continue
        if r.status_code == 200:
            latencies_s.append(time.perf_counter() - t0)
        else:
            failures[str(r.status_code)] = failures.get(str(r.status_code), 0) + 1


@dataclass
class Phase:
    """What one phase saw: the normal clients' latencies and failures, the hostile
    connections' outcomes and the server's peak open sockets."""

    latencies_s: list[float]
    failures: dict[str, int]
    held: list[Held]
    peak_sockets: int


async def phase(url: str, port: int, seconds: float, slow: int, pid: int,
                kinds: list[str]) -> Phase:
    """``seconds`` of two normal clients beside ``slow`` hostile connections of ``kinds``
    (in turn)."""
    latencies: list[float] = []
    failures: dict[str, int] = {}
    peak = open_sockets(pid)
    async with httpx.AsyncClient(timeout=30) as client:
        until = time.monotonic() + seconds
        give_up_s = max(seconds, max(KINDS.values()) + 10.0)
        hostiles = [asyncio.create_task(hostile(kinds[i % len(kinds)], port, give_up_s))
                    for i in range(slow)]
        normals = asyncio.gather(*(normal_loop(client, url, until, latencies, failures)
                                   for _ in range(2)))
        while time.monotonic() < until:
            await asyncio.sleep(1.0)
            peak = max(peak, open_sockets(pid))
        await normals
        held = list(await asyncio.gather(*hostiles))
    return Phase(latencies, failures, held, peak)


def summary(result: Phase) -> dict[str, Any]:
    return {"requests": len(result.latencies_s), "failures": result.failures,
            "p50_s": percentile(result.latencies_s, 0.50),
            "p95_s": percentile(result.latencies_s, 0.95)}


def by_kind(held: list[Held]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind, limit_s in KINDS.items():
        mine = [h for h in held if h.kind == kind]
        if not mine:
            continue
        ended = [h.held_s for h in mine if h.held_s is not None]
        endings: dict[str, int] = {}
        for h in mine:
            endings[h.ended_by] = endings.get(h.ended_by, 0) + 1
        out[kind] = {"connections": len(mine), "limit_s": limit_s, "ended_by": endings,
                     "held_max_s": max(ended, default=None),
                     "within_limit": len(ended) == len(mine)
                     and all(s <= limit_s + 2.0 for s in ended)}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--slow", type=int, default=400, help="hostile connections")
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help=f"comma-separated, of: {', '.join(KINDS)}")
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    if set(kinds) - set(KINDS):
        parser.error(f"unknown kinds: {sorted(set(kinds) - set(KINDS))}")
    if args.quick:
        args.slow, args.seconds = 40, 35.0
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd, _ = sluice_cmd(config_toml(), port)
    with running(cmd, f"{url}/ready") as proc:
        asyncio.run(phase(url, port, 3.0, 0, proc.pid, kinds))  # warm-up: first steps
        sockets_before = open_sockets(proc.pid)
        baseline = asyncio.run(phase(url, port, args.seconds, 0, proc.pid, kinds))
        rss_before = rss_bytes(proc.pid)
        attacked = asyncio.run(phase(url, port, args.seconds, args.slow, proc.pid, kinds))
        rss_after = rss_bytes(proc.pid)
        time.sleep(1.0)
        sockets_after = open_sockets(proc.pid)
    base, hit = summary(baseline), summary(attacked)
    ratio = hit["p95_s"] / base["p95_s"] if base["p95_s"] and hit["p95_s"] else None
    outcomes = by_kind(attacked.held)
    result = {
        "benchmark": "slow_clients", "model": GEMMA, "quick": args.quick,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "hostile_connections": args.slow, "phase_s": args.seconds,
        "limits_s": {"header_timeout_s": HEADER_TIMEOUT_S, "body_timeout_s": BODY_TIMEOUT_S,
                     "keep_alive_timeout_s": KEEP_ALIVE_S},
        "normal_baseline": base, "normal_attacked": hit, "normal_p95_ratio": ratio,
        "hostile_by_kind": outcomes,
        "server_sockets": {"before": sockets_before, "peak": attacked.peak_sockets,
                           "after": sockets_after},
        "rss_before_bytes": rss_before, "rss_after_bytes": rss_after,
        "goals": {"normal_p95_within_1_5x": ratio is not None and ratio <= 1.5,
                  "normal_requests_all_served": not attacked.failures,
                  "every_connection_ended_within_limit": all(k["within_limit"]
                                                             for k in outcomes.values()),
                  "sockets_back_to_baseline": sockets_after <= sockets_before + 2},
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "slow_clients.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, RESULTS / "slow_clients.png")
    print(json.dumps({k: result[k] for k in ("normal_baseline", "normal_attacked",
                                             "normal_p95_ratio", "hostile_by_kind",
                                             "server_sockets", "goals")}, indent=2))
    return 0


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    p95 = [result["normal_baseline"]["p95_s"] or 0, result["normal_attacked"]["p95_s"] or 0]
    left.bar(["alone", f"beside {result['hostile_connections']} slow"],
             [v * 1000 for v in p95], color=["#4c72b0", "#dd8452"])
    left.set_ylabel("normal clients' latency p95 (ms)")
    left.set_title(f"p95 ratio {result['normal_p95_ratio'] or 0:.2f}x")
    kinds = result["hostile_by_kind"]
    names = list(kinds)
    right.bar(names, [kinds[k]["held_max_s"] or 0 for k in names], color="#55a868",
              label="longest held")
    right.scatter(names, [kinds[k]["limit_s"] for k in names], color="black", marker="_",
                  s=400, label="limit", zorder=3)
    right.set_ylabel("seconds the server held it")
    right.tick_params(axis="x", labelrotation=20)
    right.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
