"""The README's headline table is the committed ``python -m bench`` run: each row's sluice
and llama-server tokens/s are the closed-loop figures of ``bench/results/llm_bench.json``
(so a rerun that is committed without the README, or the reverse, fails here)."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| (\d+)(?: \(\d+ slots\))? \| ([\d.]+) \| ([\d.]+) \| ([\d.]+)×")


def test_the_readme_headline_is_the_committed_bench_run() -> None:
    result = json.loads((ROOT / "bench/results/llm_bench.json").read_text())
    measured = {(r["label"], r["system"]): r["tokens_per_s"] for r in result["rows"]
                if r["kind"] == "closed"}
    rows = [ROW.match(line) for line in (ROOT / "README.md").read_text().splitlines()]
    table = [m for m in rows if m is not None]
    assert len(table) >= 3
    for m in table:
        label = f"c={m.group(1)}"
        sluice = measured[(label, "sluice-continuous")]
        peer = measured[(label, "llama-server")]
        assert float(m.group(2)) == round(sluice, 1), label
        assert float(m.group(3)) == round(peer, 1), label
        assert float(m.group(4)) == round(sluice / peer, 2), label
    assert result["started"][:10] in (ROOT / "README.md").read_text()
