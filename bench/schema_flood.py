"""Hostile structured-output schemas: can one tenant's flood of costly schemas take memory
or another tenant's latency?

One ``sluice serve`` on the packaged Gemma 3 270M (its 262,144-token vocabulary is what makes
a grammar costly to compile). Tenant ``victim`` (no limits) runs a closed loop of short
greedy completions, first alone (the baseline), then beside tenant ``attacker``
(``requests_per_s = 1``, burst 1), which sends distinct schemas from ``--attackers``
concurrent clients: one at a pace the quota admits (each of its schemas is compiled), the
others as fast as they are answered (refused past the quota). Half are near the default
limits (nested ``anyOf`` of about 800 alternatives, under ``max_schema_bytes``), half far
past them (about 430 KB). The report gives the victim's latency p50/p95 in both phases and
their ratio, the server's RSS before and after the flood, how each hostile request was
answered (200, 400 naming the limit, 429) and how fast the refusals came.

Goals: RSS growth under 100 MB, the victim's p95 within 1.5x of its baseline, every hostile
request past its quota refused in under 50 ms.

    python bench/schema_flood.py               # about 2 minutes
    python bench/schema_flood.py --quick       # a smoke run

Writes bench/results/schema_flood.json and .png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from bench.lib.loadgen import percentile
from bench.lib.model_tables import GEMMA, gemma_table, server_tables
from bench.lib.outcomes import rss_bytes
from bench.lib.servers import free_port, running, sluice_cmd

RESULTS = Path(__file__).resolve().parent / "results"
VICTIM_KEY, ATTACKER_KEY = "key-victim", "key-attacker"
PACE_S = 1.0  # each attacker client: one schema a second (all of them: past the quota)


def config_toml() -> str:
    return (server_tables(GEMMA, queue=64, inbox=32, budget_bytes=4_000_000_000)
            + gemma_table(n_seq_max=8)
            + f"""
[[tenants]]
id = "victim"
api_keys = ["{VICTIM_KEY}"]

[[tenants]]
id = "attacker"
api_keys = ["{ATTACKER_KEY}"]
limits = {{ requests_per_s = 1, burst = 1 }}
""")


def hostile_schema(i: int, alternatives: int) -> dict[str, Any]:
    """A distinct nested ``anyOf`` schema (``i`` makes each one new to the compile cache)."""
    branches = [{"type": "object", "properties": {f"k{i}_{j}": {"const": f"v{j}"}},
                 "required": [f"k{i}_{j}"]} for j in range(alternatives)]
    return {"type": "object", "properties": {"x": {"anyOf": branches}}, "required": ["x"]}


async def victim_loop(client: httpx.AsyncClient, url: str, until_s: float,
                      latencies_s: list[float], statuses: dict[int, int]) -> None:
    body = {"model": GEMMA, "prompt": "The capital of France is", "max_tokens": 8,
            "temperature": 0}
    while time.monotonic() < until_s:
        t0 = time.perf_counter()
        r = await client.post(f"{url}/v1/completions", json=body,
                              headers={"authorization": f"Bearer {VICTIM_KEY}"})
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        if r.status_code == 200:
            latencies_s.append(time.perf_counter() - t0)


async def attacker(client: httpx.AsyncClient, url: str, schemas: list[dict[str, Any]],
                   answers: list[dict[str, Any]], until_s: float,
                   interval_s: float | None) -> None:
    """Send a new schema from ``schemas`` every ``interval_s`` after the last answer (as
    soon as it comes when None)."""
    while schemas and time.monotonic() < until_s:
        schema = schemas.pop()
        if interval_s is not None:
            await asyncio.sleep(interval_s)
        body = {"model": GEMMA, "prompt": "{", "max_tokens": 4,
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": "s", "schema": schema}}}
        data = json.dumps(body).encode()  # encoded before the clock starts: the server's time
        t0 = time.perf_counter()
        r = await client.post(f"{url}/v1/completions", content=data,
                              headers={"authorization": f"Bearer {ATTACKER_KEY}",
                                       "content-type": "application/json"})
        code = r.json().get("error", {}).get("code") if r.status_code != 200 else None
        answers.append({"status": r.status_code, "code": code,
                        "latency_s": time.perf_counter() - t0})


async def phase(url: str, seconds: float, schemas: list[dict[str, Any]] | None,
                attackers: int) -> tuple[list[float], list[dict[str, Any]]]:
    latencies: list[float] = []
    answers: list[dict[str, Any]] = []
    statuses: dict[int, int] = {}
    async with httpx.AsyncClient(timeout=120) as client:
        until = time.monotonic() + seconds
        tasks = [victim_loop(client, url, until, latencies, statuses) for _ in range(2)]
        if schemas is not None:
            tasks += [attacker(client, url, schemas, answers, until, PACE_S)
                      for _ in range(attackers)]
        await asyncio.gather(*tasks)
    if set(statuses) - {200}:
        print(f"victim answers: {statuses}", file=sys.stderr)
    return latencies, answers


def summary(latencies: list[float]) -> dict[str, Any]:
    return {"requests": len(latencies), "p50_s": percentile(latencies, 0.50),
            "p95_s": percentile(latencies, 0.95)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--schemas", type=int, default=400)
    parser.add_argument("--attackers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    if args.quick:
        args.schemas, args.seconds = 40, 10.0
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd, _ = sluice_cmd(config_toml(), port)
    with running(cmd, f"{url}/ready") as proc:
        asyncio.run(phase(url, 3.0, None, 0))  # warm-up: the model's first steps
        baseline, _ = asyncio.run(phase(url, args.seconds, None, 0))
        rss_before = rss_bytes(proc.pid)
        schemas = [hostile_schema(i, 800 if i % 2 else 4000) for i in range(args.schemas)]
        sizes = [len(json.dumps(s)) for s in schemas]
        attacked, answers = asyncio.run(phase(url, args.seconds, schemas, args.attackers))
        rss_after = rss_bytes(proc.pid)
    refused = [a for a in answers if a["status"] == 429]
    by_answer: dict[str, int] = {}
    for a in answers:
        key = f"{a['status']} {a['code'] or ''}".strip()
        by_answer[key] = by_answer.get(key, 0) + 1
    base, hit = summary(baseline), summary(attacked)
    result = {
        "benchmark": "schema_flood", "model": GEMMA, "quick": args.quick,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "schemas": args.schemas, "schema_bytes_min": min(sizes), "schema_bytes_max": max(sizes),
        "attackers": args.attackers, "phase_s": args.seconds,
        "victim_baseline": base, "victim_attacked": hit,
        "victim_p95_ratio": (hit["p95_s"] / base["p95_s"]) if base["p95_s"] and hit["p95_s"]
        else None,
        "rss_before_bytes": rss_before, "rss_after_bytes": rss_after,
        "rss_growth_bytes": rss_after - rss_before,
        "hostile_answers": by_answer,
        "quota_refusal_p95_s": percentile([a["latency_s"] for a in refused], 0.95),
        "quota_refusal_max_s": max((a["latency_s"] for a in refused), default=None),
        "goals": {"rss_growth_under_100mb": rss_after - rss_before < 100_000_000,
                  "victim_p95_within_1_5x": None, "refusals_under_50ms": None},
    }
    ratio = result["victim_p95_ratio"]
    result["goals"]["victim_p95_within_1_5x"] = ratio is not None and ratio <= 1.5
    worst = result["quota_refusal_max_s"]
    result["goals"]["refusals_under_50ms"] = worst is not None and worst < 0.050
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "schema_flood.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, RESULTS / "schema_flood.png")
    print(json.dumps({k: result[k] for k in ("victim_baseline", "victim_attacked",
                                             "victim_p95_ratio", "rss_growth_bytes",
                                             "hostile_answers", "quota_refusal_max_s",
                                             "goals")}, indent=2))
    return 0


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    phases = ["alone", "beside the flood"]
    p95 = [result["victim_baseline"]["p95_s"] or 0, result["victim_attacked"]["p95_s"] or 0]
    left.bar(phases, [v * 1000 for v in p95], color=["#4c72b0", "#dd8452"])
    left.set_ylabel("victim latency p95 (ms)")
    left.set_title(f"victim p95 ratio {result['victim_p95_ratio'] or 0:.2f}x")
    answers = result["hostile_answers"]
    right.bar(list(answers), list(answers.values()), color="#55a868")
    right.set_title(f"hostile answers (RSS +{result['rss_growth_bytes'] / 1e6:.0f} MB)")
    right.tick_params(axis="x", labelrotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
