"""Tables and plots shared by the LLM benchmarks: the SLOs a request must meet to count as
goodput, millisecond cells, ratios, the open-loop panels, and the machine and commit a
result was measured on."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

TTFT_SLO_S, TPOT_SLO_S = 2.0, 0.150
"""The SLOs a request must meet to count as goodput (llm_bench.py and llm_slo.py)."""


def ratio(a: float | None, b: float | None, digits: int = 3) -> float | None:
    """``a / b`` rounded, or ``None`` when either is missing or ``b`` is 0."""
    return None if a is None or b is None or b == 0 else round(a / b, digits)


def ms(v: float | None) -> str:
    """Seconds as a fixed-width millisecond cell; ``-`` for none."""
    return "   -   " if v is None else f"{v * 1000:6.0f}ms"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


GOODPUT_TITLE = f"Goodput (TTFT ≤ {TTFT_SLO_S:g} s, TPOT ≤ {TPOT_SLO_S * 1000:g} ms)"


def plot_open_loop(rows: list[dict[str, Any]], axes: dict[str, Any]) -> None:
    """A line a system on each of ``axes`` (a row's metric → its matplotlib Axes) over the
    open-loop rows' offered load (× capacity); ``ttft_p95_ms`` is ``ttft_p95_s`` in ms."""
    for system in sorted({r["system"] for r in rows}):
        opened = sorted((r for r in rows if r["system"] == system and r["kind"] == "open"),
                        key=lambda r: r["load_factor"])
        if not opened:
            continue
        x = [r["load_factor"] for r in opened]
        for metric, ax in axes.items():
            y = ([(r["ttft_p95_s"] or 0) * 1000 for r in opened] if metric == "ttft_p95_ms"
                 else [r[metric] for r in opened])
            ax.plot(x, y, marker="o", label=system)


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    cpu = platform.processor()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {"cpus": os.cpu_count(), "cpu": cpu, "platform": platform.platform()}


def commit() -> str | None:
    """The checkout's commit, if this runs from a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, cwd=Path(__file__).parent, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip() or None
