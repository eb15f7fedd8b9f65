"""Fuzz sluice's HTTP API with schemathesis, from the server's own OpenAPI schema
(``/openapi.json``), on 127.0.0.1, bounded in examples and time.

Checks: no 5xx (``not_a_server_error``; the 5xx allowed are the two answers a generated
``deadline_ms`` of a few microseconds earns honestly: 503 ``deadline_infeasible``, refused
on arrival, and 504 ``deadline``, expired while queued; and llama-server's 501 for what the
served model or sluice does not do: ``/infill`` without FIM tokens, ``POST /props``),
responses conform to the declared status codes, content types and schemas. Valid and
invalid inputs both (``--mode all``). The server must still answer ``/health`` afterwards.

    python bench/fuzz.py                         # 200 examples per operation, <= 5 min
    python bench/fuzz.py --max-examples 20 --max-time 60

Writes bench/results/fuzz.json (and the JUnit report beside it).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.model_tables import synthetic_chat_table
from bench.lib.servers import free_port, running, sluice_cmd

RESULTS = Path(__file__).resolve().parent / "results"
CHECKS = ("not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_schema_conformance")
SCHEMATHESIS_TOML = """
[checks.not_a_server_error]
expected-statuses = ["2xx", "3xx", "4xx", "501", "503", "504"]
"""

FUZZ_SERVER_TOML = """
[server]
default_model = "synth-chat"
open_admin = true  # fuzz the admin routes too (without a key they answer only 403)
openapi = true  # the schema schemathesis reads (off by default)
[scheduling]
queue_capacity = 64
[workers]
count = 1
budget_bytes = 2_000_000_000
inbox_capacity = 16
[[models]]
id = "synth-a"
kind = "oneshot"
backend = "synthetic"
task = "embedding"
memory_bytes = 100_000_000
options = { dim = 8, load_s = 0.0, batch_fixed_s = 0.0005, per_item_s = 0.0001 }
""" + synthetic_chat_table(step_fixed_s=0.0005, decode_per_seq_s=0.0001,
                           prefill_per_token_s=0.00001, byte_tokens=True)


def schemathesis_bin() -> str:
    return str(Path(sys.executable).parent / "schemathesis")


def fuzz(base_url: str, *, max_examples: int, max_time_s: int, seed: int = 1,
         workers: int = 1, report_dir: Path | None = None) -> dict[str, Any]:
    """Run schemathesis against ``base_url``; returns its outcome as plain data."""
    report_dir = report_dir or Path(tempfile.mkdtemp(prefix="sluice-fuzz-"))
    report_dir.mkdir(parents=True, exist_ok=True)
    config = report_dir / "schemathesis.toml"
    config.write_text(SCHEMATHESIS_TOML)
    junit = report_dir / "fuzz-junit.xml"
    cmd = [
        schemathesis_bin(), "--no-color", "--config-file", str(config), "run",
        f"{base_url}/openapi.json", "--url", base_url,
        "--checks", ",".join(CHECKS), "--mode", "all",
        "--max-examples", str(max_examples), "--max-time", str(max_time_s),
        "--seed", str(seed), "--workers", str(workers), "--request-timeout", "30",
        "--suppress-health-check", "all", "--report", "junit",
        "--report-junit-path", str(junit),
    ]
    t0 = time.monotonic()
    # cwd: schemathesis keeps a cache folder (.schemathesis/) in its working directory
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max_time_s + 300,
                          cwd=report_dir)
    seconds = time.monotonic() - t0
    names, failures = _junit_cases(junit)
    return {
        "command": " ".join(cmd[1:]).replace(str(report_dir), "<report_dir>"),
        "exit_code": proc.returncode,
        "seconds": round(seconds, 1),
        "operations": len(names),
        "operation_names": names,
        "failed_operations": failures,
        "summary": _summary(proc.stdout),
        "output_tail": (proc.stdout + proc.stderr)[-6000:],
    }


def _junit_cases(path: Path) -> tuple[list[str], list[str]]:
    """The operations tested (``POST /v1/messages``, ...) and those that failed."""
    if not path.exists():
        return [], []
    root = ET.parse(path).getroot()
    cases = root.findall(".//testcase")
    failed = [c.get("name", "?") for c in cases
              if c.find("failure") is not None or c.find("error") is not None]
    return [c.get("name", "?") for c in cases], failed


def _summary(stdout: str) -> list[str]:
    """The lines of schemathesis's closing summary worth keeping."""
    keep = ("passed", "failed", "generated", "test cases", "operations", "No issues",
            "Test Phase", "Examples", "Coverage", "Fuzzing", "Stateful")
    return [ln.strip() for ln in stdout.splitlines() if any(k in ln for k in keep)][-20:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-examples", type=int, default=200)
    parser.add_argument("--max-time", type=int, default=300, help="seconds, whole run")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS / "fuzz.json")
    args = parser.parse_args()
    port = free_port()
    cmd, _ = sluice_cmd(FUZZ_SERVER_TOML, port)
    base = f"http://127.0.0.1:{port}"
    with running(cmd, f"{base}/ready") as proc:
        result = fuzz(base, max_examples=args.max_examples, max_time_s=args.max_time,
                      seed=args.seed, report_dir=args.out.parent / "fuzz-report")
        health = httpx.get(f"{base}/health", timeout=5).status_code
        result["health_after"] = health
        result["server_alive_after"] = proc.poll() is None
    result["max_examples"] = args.max_examples
    result["max_time_s"] = args.max_time
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({k: v for k, v in result.items() if k != "output_tail"},
                                   indent=2))
    print(result["output_tail"])
    print(json.dumps({k: v for k, v in result.items() if k != "output_tail"}, indent=2))
    ok = result["exit_code"] == 0 and health == 200 and result["server_alive_after"]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
