"""Per-token overhead of gRPC streaming against HTTP/SSE, on the real model.

One ``sluice serve`` (Gemma 3 270M, llama.cpp, 8 slots, 2 threads) serving both protocols
from one process and event loop. At 1 and 8 concurrent clients, closed loops of greedy
generations (64 tokens, EOS ignored, the same prompts) alternate between the protocols,
``--repeats`` times each, so both see the same machine state. Per phase:

- server CPU per generated token (the server process's user+system time from /proc, over
  the phase, divided by the tokens): model work is the same for both protocols, so the
  difference is what each protocol costs the server per token;
- client-observed time per output token (mean gap between a request's tokens) and
  aggregate tokens/s;
- client CPU per token (this process: parsing SSE JSON vs protobuf).

Prints the ratios gRPC / HTTP and writes bench/results/grpc_overhead.json and .png.

    python bench/grpc_overhead.py    # about 3 minutes
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.model_tables import GEMMA, gemma_table, server_tables
from bench.lib.prompts import PROMPTS
from bench.lib.servers import free_port, process_cpu_s, running, sluice_cmd
from sluice.backends.packaged import gemma_gguf_path
from sluice.v1 import inference_pb2 as pb
from sluice.v1 import inference_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
MODEL = GEMMA
MAX_TOKENS = 64
_model = MODEL
"""The model the clients ask for (``--smoke`` switches to the synthetic one)."""


def toml(gguf: Path) -> str:
    return server_tables(MODEL, 256, 64) + gemma_table(str(gguf))


async def http_one(client: httpx.AsyncClient, base: str, prompt: str) -> list[float]:
    """Token arrival times of one streamed completion over SSE."""
    body = {"model": _model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.0,
            "stream": True, "ignore_eos": True}
    times: list[float] = []
    async with client.stream("POST", f"{base}/v1/completions", json=body, timeout=300) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0]["text"]:
                    times.append(time.perf_counter())
    return times


async def grpc_one(s: inference_pb2_grpc.InferenceStub, prompt: str) -> list[float]:
    """Token arrival times of one Generate stream."""
    times: list[float] = []
    request = pb.GenerateRequest(model=_model, prompt=prompt, max_tokens=MAX_TOKENS,
                                 temperature=0.0, ignore_eos=True)
    async for message in s.Generate(request, timeout=300):
        if message.WhichOneof("event") == "token" and message.token.text:
            times.append(time.perf_counter())
    return times


async def phase(protocol: str, base: str, target: str, clients: int,
                per_client: int) -> tuple[list[list[float]], float]:
    """``clients`` closed-loop clients, ``per_client`` requests each; token times."""
    prompts = iter(range(clients * per_client))
    streams: list[list[float]] = []
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=clients + 2)) as hc, \
            grpc.aio.insecure_channel(target) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)

        async def user() -> None:
            for i in prompts:
                prompt = PROMPTS[i % len(PROMPTS)]
                streams.append(await (http_one(hc, base, prompt) if protocol == "http"
                                      else grpc_one(stub, prompt)))

        t0 = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(clients)))
        return streams, time.perf_counter() - t0


def measure(protocol: str, pid: int, base: str, target: str, clients: int,
            per_client: int) -> dict[str, Any]:
    server0, client0 = process_cpu_s(pid), time.process_time()
    streams, wall = asyncio.run(phase(protocol, base, target, clients, per_client))
    server_cpu, client_cpu = process_cpu_s(pid) - server0, time.process_time() - client0
    tokens = sum(len(s) for s in streams)
    gaps = [(s[-1] - s[0]) / (len(s) - 1) for s in streams if len(s) > 1]
    return {"protocol": protocol, "clients": clients, "requests": len(streams),
            "tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall,
            "server_cpu_ms_per_token": server_cpu * 1000 / tokens,
            "client_cpu_ms_per_token": client_cpu * 1000 / tokens,
            "tpot_ms": statistics.fmean(gaps) * 1000}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for clients in sorted({r["clients"] for r in rows}):
        per: dict[str, dict[str, float]] = {}
        for protocol in ("http", "grpc"):
            mine = [r for r in rows if r["clients"] == clients and r["protocol"] == protocol]
            per[protocol] = {k: statistics.fmean(r[k] for r in mine) for k in (
                "server_cpu_ms_per_token", "client_cpu_ms_per_token", "tpot_ms",
                "tokens_per_s")}
            per[protocol]["server_cpu_ms_per_token_stdev"] = statistics.stdev(
                r["server_cpu_ms_per_token"] for r in mine) if len(mine) > 1 else 0.0
        http, g = per["http"], per["grpc"]
        out[str(clients)] = {
            **per,
            "server_cpu_us_per_token_saved_by_grpc":
                (http["server_cpu_ms_per_token"] - g["server_cpu_ms_per_token"]) * 1000,
            "ratio_server_cpu_grpc_over_http":
                g["server_cpu_ms_per_token"] / http["server_cpu_ms_per_token"],
            "ratio_client_cpu_grpc_over_http":
                g["client_cpu_ms_per_token"] / http["client_cpu_ms_per_token"],
            "ratio_tpot_grpc_over_http": g["tpot_ms"] / http["tpot_ms"],
            "ratio_tokens_per_s_grpc_over_http": g["tokens_per_s"] / http["tokens_per_s"],
        }
    return out


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    clients = list(summary)
    metrics = [("server_cpu_ms_per_token", "server CPU ms / token"),
               ("client_cpu_ms_per_token", "client CPU ms / token"),
               ("tpot_ms", "time per output token (ms)")]
    for ax, (key, label) in zip(axes, metrics, strict=True):
        for i, protocol in enumerate(("http", "grpc")):
            xs = [j + (i - 0.5) * 0.35 for j in range(len(clients))]
            ax.bar(xs, [summary[c][protocol][key] for c in clients], width=0.35,
                   label="HTTP/SSE" if protocol == "http" else "gRPC stream")
        ax.set_xticks(range(len(clients)), [f"{c} client{'s' if c != '1' else ''}"
                                            for c in clients])
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"sluice: gRPC streaming vs HTTP/SSE per token ({MODEL}, {MAX_TOKENS} "
                 "tokens/request, one server, interleaved runs)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--per-client", type=int, default=2,
                        help="requests per client per phase")
    parser.add_argument("--smoke", action="store_true",
                        help="check the script on the synthetic model; writes to /tmp")
    args = parser.parse_args()
    global _model
    results = RESULTS
    if args.smoke:
        _model, results = "synth-chat", Path(tempfile.mkdtemp(prefix="grpc-overhead-"))
        config = (ROOT / "examples" / "synthetic.toml").read_text()
    else:
        config = toml(gemma_gguf_path())
    port, grpc_port = free_port(), free_port()
    cmd, _ = sluice_cmd(config, port)
    cmd += ["--grpc-port", str(grpc_port)]
    base, target = f"http://127.0.0.1:{port}", f"127.0.0.1:{grpc_port}"
    rows: list[dict[str, Any]] = []
    with running(cmd, f"{base}/ready") as proc:
        for protocol in ("http", "grpc"):  # warm-up, not recorded
            measure(protocol, proc.pid, base, target, 1, 1)
        for clients in (1, 8):
            for rep in range(args.repeats):
                order = ("http", "grpc") if rep % 2 == 0 else ("grpc", "http")
                for protocol in order:
                    row = measure(protocol, proc.pid, base, target, clients,
                                  args.per_client * (2 if clients == 1 else 1))
                    row["repeat"] = rep
                    rows.append(row)
                    print(f"{clients} client(s) {protocol:4s} #{rep}: "
                          f"{row['tokens_per_s']:6.1f} tok/s  tpot {row['tpot_ms']:6.2f} ms  "
                          f"server {row['server_cpu_ms_per_token']:6.3f} ms/tok  "
                          f"client {row['client_cpu_ms_per_token']:6.3f} ms/tok", flush=True)
    summary = summarize(rows)
    for clients, s in summary.items():
        print(f"{clients} client(s): gRPC/HTTP server CPU per token "
              f"{s['ratio_server_cpu_grpc_over_http']:.3f} "
              f"({s['server_cpu_us_per_token_saved_by_grpc']:+.0f} µs/token saved), "
              f"client CPU {s['ratio_client_cpu_grpc_over_http']:.3f}, "
              f"TPOT {s['ratio_tpot_grpc_over_http']:.3f}, "
              f"tok/s {s['ratio_tokens_per_s_grpc_over_http']:.3f}")
    results.mkdir(exist_ok=True)
    out = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                       "python": platform.python_version()},
           "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "model": _model, "max_tokens": MAX_TOKENS, "repeats": args.repeats,
           "rows": rows, "summary": summary}
    (results / "grpc_overhead.json").write_text(json.dumps(out, indent=2) + "\n")
    plot(summary, results / "grpc_overhead.png")
    print(f"wrote {results / 'grpc_overhead.json'} and .png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
