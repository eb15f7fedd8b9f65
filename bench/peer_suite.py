"""llama.cpp's own server test suite as a compatibility benchmark: the same tests against
``llama-server`` and against ``sluice serve``, on the same packaged model.

Question: of the tests llama.cpp writes for its server, which does sluice pass where
llama-server passes, and why does it fail the others?

The suite is ``tools/server/tests`` of the llama.cpp sources vendored in the
llama-cpp-python sdist that sluice pins (``bench/lib/llama_server.py`` unpacks them beside
its llama-server build). Its ``utils.ServerProcess`` starts the binary named by
``$LLAMA_SERVER_BIN_PATH`` with llama-server's flags; here that is
``bench/lib/peer_wrapper.py``, which replaces the suite's Hugging Face models with the
packaged GGUFs (the same for both servers: its docstring says which preset gets which
model, and what it maps and drops for sluice) and ``exec``s the server. Both servers run
2 threads on 127.0.0.1, one at a time, under ``nice -n 5``.

The harness, beside the suite's own files (``peer_plugin.py``, written at run time): the
suite's ``ServerPreset.load_all()`` (which downloads every preset's model at the start) is
a no-op, the ``wget`` module it imports is a stub that refuses to download, and every test
is bounded (``--timeout``, default 120 s, setup to teardown; a test past it fails).

Each file of ``FILES`` that this llama.cpp version has runs once per server (pytest's
junit report gives each test's outcome). Results: per file passed / failed / skipped for
both servers, and every test that passes on llama-server and fails on sluice with its class
from ``CLASSES``, a table written by reading each failure (class ``?`` when a failure is not
in it): (a) a feature sluice lacks or deliberately omits, (b) a different error (status,
type or message), (c) an assertion on the suite's own model's exact text, (d) harness.

    python bench/peer_suite.py                      # every file, both servers (~1 h)
    python bench/peer_suite.py --files basic,tokenize --servers sluice   # merge a rerun

writes ``bench/results/peer_suite.json`` and ``.png``; a rerun of some files or one server
replaces those entries and keeps the rest.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib import llama_server
from bench.lib.report import commit, machine, markdown_table

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parent.parent
SERVERS = ("llama-server", "sluice")
FILES = ("basic", "chat_completion", "completion", "tokenize", "security", "embedding",
         "infill", "slot_save", "ctx_shift", "tool_call", "metrics", "rerank", "template",
         "stream", "compat_anthropic", "compat_oai_responses", "sleep", "router")
"""The suite's files whose feature sluice has (``unit/test_<name>.py``)."""
PORT = 18480
"""Where the suite's servers listen (its default 8080 is a common port)."""

_IMAGE_REFUSED = ("an image block on a text-only model is a 400 invalid_request_error (\"This "
                  "model takes text only\"), as Anthropic's API would answer a model without "
                  "vision; llama-server answers 500 \"image input is not supported\"")

CLASSES: dict[str, tuple[str, str]] = {
    "test_security.py::test_cors_options*": (
        "a", "deliberate: CORS is off unless --cors-origins names origins (llama-server "
             "answers every origin by default)"),
    "test_security.py::test_cors_origins_defaults_to_localhost_with_tools_enabled": (
        "a", "no server-side tools (--tools): sluice serve refuses the flag"),
    "test_security.py::test_cors_proxy_only_forwards_explicit_proxy_headers": (
        "a", "deliberate: no /cors-proxy (--ui-mcp-proxy), a web UI's fetch proxy"),
    "test_metrics.py::test_metrics_disabled": (
        "a", "deliberate: /metrics is always served (guarded by server.metrics_key), so no "
             "501 without --metrics"),
    "test_metrics.py::test_metrics_prometheus_format": (
        "b", "deliberate: llamacpp:n_tokens_max is typed a gauge (it can go down), which "
             "llama-server types a counter"),
    "test_metrics.py::test_metrics_prompt_processed_and_cached": (
        "a", "deliberate: a retained prefix is reused from 16 tokens on "
             "(engine.min_prefix_tokens); the test's prompt has 10"),
    "test_sleep.py::test_server_sleep_metrics_buckets": (
        "a", "llama-server's per-scrape throughput window (predicted_tokens_seconds resets "
             "after a scrape and is frozen while asleep) is not how sluice's gauge works"),
    "test_sleep.py::test_server_sleep_read_only_endpoints": (
        "a", "while the model is unloaded /metrics is live, not a snapshot frozen at sleep"),
    "test_sleep.py::test_server_sleep_token_counting_wake": (
        "a", "deliberate: counting tokens needs only the tokenizer, so it does not load "
             "(wake) the model"),
    "test_compat_anthropic.py::test_anthropic_empty_messages": (
        "a", "deliberate: an empty messages list is refused (400 invalid_request_error), as "
             "Anthropic's API refuses it; llama-server answers an empty conversation"),
    "test_compat_anthropic.py::test_anthropic_tool_result_with_image": (
        "b", _IMAGE_REFUSED),
    "test_compat_anthropic.py::test_anthropic_vision_format_accepted": (
        "b", _IMAGE_REFUSED),
    "test_completion.py::test_completion_parallel_slots[[]4-6]": (
        "c", "one answer sampled at temperature 1 (seed 42) is empty, where the test wants "
             "over 10 characters: it is the only case with the suite's 5th and 6th prompts, "
             "and sluice's seeded sampler draws other tokens than llama.cpp's (every other "
             "case of the test passes)"),
    "test_embedding.py::test_embedding_pooling_none_oai": (
        "a", "--pooling none (one vector per token, on /embeddings only) is refused at start "
             "by name: sluice embeds one pooled vector per input"),
    "test_compat_oai_responses.py::test_responses_stream_with_llama_telemetry": (
        "b", "deliberate: a response cut by max_output_tokens ends with OpenAI's "
             "response.incomplete (status incomplete), where llama-server sends "
             "response.completed; the progress events and timings the test reads are there"),
    "test_router.py::test_router_props": (
        "a", "sluice has no router process: one server holds every model of the folder in "
             "residency under a memory budget (--models-max and --no-models-autoload are "
             "not served), so /props describes the default model, without a router's role"),
    "test_router.py::test_router_delete_model": (
        "a", "deliberate: no model downloads (POST /models) and no DELETE /models: sluice "
             "serves packaged or local files, which it never deletes"),
}
"""Test id (``file::test[params]``, fnmatch patterns allowed) → (class, reason), for the
tests that pass on llama-server and fail on sluice, written by reading each failure."""

PLUGIN = '''
"""peer_suite's harness inside llama.cpp's server tests (written by bench/peer_suite.py)."""
import os
import signal

import pytest


class PeerTimeout(Exception):
    pass


def pytest_sessionstart(session):
    import utils
    utils.ServerPreset.load_all = staticmethod(lambda: None)


def _alarm(signum, frame):
    raise PeerTimeout(f"test ran past {os.environ['PEER_TEST_TIMEOUT']} s")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(int(os.environ["PEER_TEST_TIMEOUT"]))
    try:
        yield
    finally:
        signal.alarm(0)
'''

WGET_STUB = '''
"""No hub is reachable: the suite's downloads fail clearly (bench/peer_suite.py)."""


def download(url, out=None, bar=None):
    raise RuntimeError(f"peer_suite: no download of {url}")
'''

LAUNCHER = """#!/bin/sh
PYTHONPATH={repo} exec {python} -m bench.lib.peer_wrapper {which} "$@"
"""


def suite_dir() -> Path:
    """The vendored ``tools/server/tests`` (unpacked by the llama-server build)."""
    path = llama_server.cache_dir() / "src" / "tools" / "server" / "tests"
    if not (path / "utils.py").exists():
        raise FileNotFoundError(f"{path}: run bench/lib/llama_server.py first")
    return path


def harness(binary: Path) -> tuple[Path, dict[str, str]]:
    """The harness folder (plugin, wget stub, launchers, the router's models folder) and
    the environment every run shares."""
    from sluice.backends.packaged import gemma_gguf_path, smollm2_gguf_path

    root = llama_server.cache_dir() / "peer_harness"
    models = root / "models"
    models.mkdir(parents=True, exist_ok=True)
    gemma, smollm2 = gemma_gguf_path(progress=False), smollm2_gguf_path()
    for src in (gemma, smollm2):
        link = models / src.name
        if not link.exists():
            link.symlink_to(src)
    (root / "peer_plugin.py").write_text(PLUGIN, encoding="utf-8")
    (root / "wget.py").write_text(WGET_STUB, encoding="utf-8")
    for which in ("llama", "sluice"):
        launcher = root / f"server-{which}"
        launcher.write_text(LAUNCHER.format(repo=REPO, python=sys.executable, which=which),
                            encoding="utf-8")
        launcher.chmod(0o755)
    env = {**os.environ, "PEER_GEMMA": str(gemma), "PEER_SMOLLM2": str(smollm2),
           "PEER_MODELS_DIR": str(models), "PEER_LLAMA_SERVER": str(binary),
           "PORT": str(PORT), "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
    return root, env


def run_file(name: str, server: str, root: Path, env: dict[str, str], timeout_s: int,
             select: str | None = None) -> dict[str, dict[str, str]]:
    """Each test of ``unit/test_<name>.py`` on ``server`` (``select``: those pytest's ``-k``
    picks): id → outcome and message."""
    tests = suite_dir()
    report = root / f"junit-{server}-{name}.xml"
    report.unlink(missing_ok=True)
    which = "llama" if server == "llama-server" else "sluice"
    run_env = {**env, "LLAMA_SERVER_BIN_PATH": str(root / f"server-{which}"),
               "PEER_TEST_TIMEOUT": str(timeout_s)}
    cmd = ["nice", "-n", "5", sys.executable, "-m", "pytest", f"unit/test_{name}.py", "-q",
           "-p", "peer_plugin", "-p", "no:cacheprovider", "-p", "no:randomly",
           f"--junitxml={report}", "-o", "junit_logging=no", *(["-k", select] if select else [])]
    started = time.monotonic()
    with (root / f"log-{server}-{name}.txt").open("wb") as log, \
            contextlib.suppress(subprocess.TimeoutExpired):
        subprocess.run(cmd, cwd=tests, env=run_env, stdout=log, stderr=subprocess.STDOUT,
                       timeout=timeout_s * 200, check=False)
    print(f"  {name} on {server}: {time.monotonic() - started:.0f} s", file=sys.stderr,
          flush=True)
    return parse_junit(report, name) if report.exists() else {}


def parse_junit(report: Path, name: str) -> dict[str, dict[str, str]]:
    """A junit report's tests: ``test_<name>.py::test[params]`` → outcome and message."""
    out: dict[str, dict[str, str]] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        test_id = f"test_{name}.py::{case.get('name')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
                message = (child.get("message") or child.text or "").strip()
                break
            if child.tag == "skipped":
                outcome, message = "skipped", (child.get("message") or "").strip()
        out[test_id] = {"outcome": outcome, "message": " ".join(message.split())[:300]}
    return out


def classify(test_id: str) -> tuple[str, str]:
    """The committed class and reason of a test that fails on sluice only."""
    for pattern, entry in CLASSES.items():
        if fnmatch.fnmatchcase(test_id, pattern):
            return entry
    return "?", "not classified yet"


def summarize(tests: dict[str, dict[str, dict[str, str]]]) -> dict[str, Any]:
    """Per-file counts for both servers, and the tests that pass on one only."""
    files: dict[str, dict[str, dict[str, int]]] = {}
    only_llama, only_sluice = [], []
    for test_id in sorted(tests):
        file = test_id.split("::")[0]
        row = files.setdefault(file, {s: {"passed": 0, "failed": 0, "skipped": 0}
                                      for s in SERVERS})
        for server in SERVERS:
            got = tests[test_id].get(server)
            if got:
                row[server][got["outcome"]] += 1
        llama, ours = tests[test_id].get("llama-server"), tests[test_id].get("sluice")
        if not llama or not ours:
            continue
        if llama["outcome"] == "passed" and ours["outcome"] == "failed":
            cls, reason = classify(test_id)
            only_llama.append({"test": test_id, "class": cls, "reason": reason,
                               "sluice_error": ours["message"]})
        elif ours["outcome"] == "passed" and llama["outcome"] == "failed":
            only_sluice.append({"test": test_id, "llama_error": llama["message"]})
    totals = {s: {k: sum(f[s][k] for f in files.values()) for k in ("passed", "failed",
                                                                     "skipped")}
              for s in SERVERS}
    by_class: dict[str, int] = {}
    for entry in only_llama:
        by_class[entry["class"]] = by_class.get(entry["class"], 0) + 1
    return {"files": files, "totals": totals, "passes_llama_fails_sluice_by_class": by_class,
            "passes_llama_fails_sluice": only_llama, "passes_sluice_fails_llama": only_sluice}


def table(summary: dict[str, Any]) -> str:
    """The per-file table: passed / failed / skipped on each server."""
    rows = []
    for file, row in summary["files"].items():
        cells = [f"{row[s]['passed']} / {row[s]['failed']} / {row[s]['skipped']}"
                 if sum(row[s].values()) else "not run" for s in SERVERS]
        rows.append([file.removeprefix("test_").removesuffix(".py"), *cells])
    t = summary["totals"]
    rows.append(["**all**", *[f"{t[s]['passed']} / {t[s]['failed']} / {t[s]['skipped']}"
                              for s in SERVERS]])
    return markdown_table(["file", "llama-server (pass / fail / skip)",
                           "sluice (pass / fail / skip)"], rows)


def plot(summary: dict[str, Any], path: Path) -> None:
    """Stacked bars per file: passed, failed and skipped, llama-server beside sluice."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = list(summary["files"])
    fig, ax = plt.subplots(figsize=(12, 5))
    width = 0.4
    colors = {"passed": "#2e7d32", "failed": "#c62828", "skipped": "#9e9e9e"}
    for k, server in enumerate(SERVERS):
        xs = [i + (k - 0.5) * width for i in range(len(files))]
        bottom = [0] * len(files)
        for outcome, color in colors.items():
            ys = [summary["files"][f][server][outcome] for f in files]
            ax.bar(xs, ys, width * 0.95, bottom=bottom, color=color,
                   alpha=1.0 if server == "sluice" else 0.55,
                   label=f"{server} {outcome}")
            bottom = [b + y for b, y in zip(bottom, ys, strict=True)]
    ax.set_xticks(range(len(files)))
    ax.set_xticklabels([f.removeprefix("test_").removesuffix(".py") for f in files],
                       rotation=45, ha="right")
    ax.set_ylabel("tests")
    ax.set_title("llama.cpp server test suite: llama-server (left, pale) and sluice (right)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_results(tests: dict[str, dict[str, dict[str, str]]],
                  runs: dict[str, dict[str, list[dict[str, Any]]]], out: Path, timeout_s: int
                  ) -> dict[str, Any]:
    """Write the results file (and its plot) from ``tests`` and ``runs`` (per file and
    server: the commit each run of it ran at, its ``-k`` and when); the summary."""
    summary = summarize(tests)
    result = {
        "question": "Of llama.cpp's own server tests, which pass on sluice where they pass "
                    "on llama-server, on the same packaged model, and why do the others "
                    "fail?",
        "setup": {"llama_cpp_python": llama_server.LLAMA_CPP_PYTHON_VERSION,
                  "suite": "tools/server/tests (vendored in the llama-cpp-python sdist)",
                  "models": "SmolLM2-135M-Instruct for the chat/tool presets, Gemma 3 270M "
                            "for the others (bench/lib/peer_wrapper.py)",
                  "threads": 2, "test_timeout_s": timeout_s, "commit": commit(),
                  "machine": machine()},
        "classes": {"a": "feature sluice lacks or deliberately omits",
                    "b": "different error (status, type or message)",
                    "c": "assertion on the suite's own model's exact text",
                    "d": "harness", "?": "not classified yet"},
        **summary,
        "runs": {k: runs[k] for k in sorted(runs)},
        "tests": {k: tests[k] for k in sorted(tests)},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    if summary["files"]:
        plot(summary, out.with_suffix(".png"))
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", help="comma-separated file names (default: all of FILES)")
    parser.add_argument("--servers", default=",".join(SERVERS),
                        help="llama-server, sluice or both (default both)")
    parser.add_argument("--timeout", type=int, default=120, help="seconds per test")
    parser.add_argument("-k", dest="select", metavar="EXPR",
                        help="rerun only the tests pytest's -k EXPR picks (the file's other "
                             "results are kept)")
    parser.add_argument("--out", default=str(RESULTS / "peer_suite.json"))
    parser.add_argument("--summarize", action="store_true",
                        help="only recompute the summary of the results file (after an edit "
                             "of CLASSES)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    previous = json.loads(out.read_text()) if out.exists() else {}
    tests: dict[str, dict[str, dict[str, str]]] = previous.get("tests", {})
    runs: dict[str, dict[str, list[dict[str, Any]]]] = previous.get("runs", {})
    if not args.summarize:
        names = args.files.split(",") if args.files else list(FILES)
        servers = args.servers.split(",")
        # only the llama-server runs need its binary (find() builds one when none is built)
        binary = (llama_server.find() if "llama-server" in servers
                  else llama_server.cache_dir() / "build" / "bin" / "llama-server")
        root, env = harness(binary)
        for name in names:
            if not (suite_dir() / "unit" / f"test_{name}.py").exists():
                print(f"  {name}: not in this llama.cpp version", file=sys.stderr)
                continue
            for server in servers:
                got = run_file(name, server, root, env, args.timeout, args.select)
                stale = [t for t in tests if t.startswith(f"test_{name}.py::")
                         and (not args.select or t in got)]
                for test_id in stale:
                    tests[test_id].pop(server, None)
                for test_id, outcome in got.items():
                    tests.setdefault(test_id, {})[server] = outcome
                record = {"commit": commit(), "select": args.select,
                          "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
                past = runs.setdefault(f"test_{name}.py", {}).get(server, [])
                past = [past] if isinstance(past, dict) else past
                runs[f"test_{name}.py"][server] = [*(past if args.select else []), record]
                write_results(tests, runs, out, args.timeout)
    summary = write_results(tests, runs, out, args.timeout)
    print(table(summary))
    print("passes on llama-server, fails on sluice:", summary["passes_llama_fails_sluice_by_class"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
