"""bench/peer_suite.py's pieces that need no server: the wrapper's mapping of llama-server's
command line (as llama.cpp's suite writes it) and the summary of both servers' outcomes."""

from __future__ import annotations

import pytest

from bench.lib.peer_wrapper import llama_argv, sluice_argv
from bench.peer_suite import classify, summarize

SUITE_ARGS = ["--port", "8080", "--temp", "0.8", "--seed", "42", "--host", "127.0.0.1",
              "--offline", "--hf-repo", "ggml-org/test-model-stories260K", "--batch-size",
              "32", "--no-slots", "--alias", "tinyllama-2", "--ctx-size", "512", "--parallel",
              "2", "--n-predict", "64", "--threads", "8", "--no-jinja",
              "--sleep-idle-seconds", "1", "-fa", "on", "--no-ui"]


@pytest.fixture(autouse=True)
def models(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PEER_SMOLLM2", "/m/smollm2.gguf")
    monkeypatch.setenv("PEER_GEMMA", "/m/gemma.gguf")
    monkeypatch.setenv("PEER_MODELS_DIR", "/m")


def test_sluice_gets_the_packaged_model_and_its_own_flag_names() -> None:
    cmd = sluice_argv("python", SUITE_ARGS)
    assert cmd[:5] == ["python", "-m", "sluice.cli", "serve", "-m"]
    assert cmd[5] == "/m/smollm2.gguf"  # the chat preset gets the model with a template
    joined = " ".join(cmd)
    for kept in ("--alias tinyllama-2", "--ctx-size 512", "--parallel 2", "--no-slots",
                 "--keep-alive 1s", "--no-ui", "--unknown-model default"):
        assert kept in joined, kept
    for dropped in ("--offline", "--hf-repo", "--no-jinja", "-fa", "--sleep-idle-seconds"):
        assert dropped not in cmd, dropped
    thinking = " ".join(sluice_argv("python", [*SUITE_ARGS, "--reasoning", "off",
                                               "--reasoning-budget", "0",
                                               "--reasoning-format", "deepseek"]))
    assert "--reasoning off --reasoning-budget 0 --reasoning-format deepseek" in thinking
    assert cmd.count("--threads") == 1 and cmd[cmd.index("--threads") + 1] == "2"
    # sluice serve refuses flags it does not know: a kernel placement is dropped, not passed
    assert "--backend_sampling" not in sluice_argv("python", [*SUITE_ARGS, "--backend_sampling"])


def test_llama_server_keeps_its_flags_on_the_same_model() -> None:
    cmd = llama_argv("/bin/llama-server", SUITE_ARGS)
    assert cmd[:3] == ["/bin/llama-server", "-m", "/m/smollm2.gguf"]
    assert "--no-jinja" in cmd and "--sleep-idle-seconds" in cmd and "--offline" not in cmd
    assert cmd[cmd.index("--threads") + 1] == "2" and cmd.count("--threads") == 1
    other = llama_argv("/bin/llama-server", ["--hf-repo", "ggml-org/models", "--hf-file",
                                             "bert-bge-small/ggml-model-f16.gguf"])
    assert other[2] == "/m/gemma.gguf"
    router = llama_argv("/bin/llama-server", ["--port", "8080"])
    assert router[1:3] == ["--models-dir", "/m"]


def test_the_summary_classes_each_test_only_llama_server_passes() -> None:
    ok, bad = {"outcome": "passed", "message": ""}, {"outcome": "failed", "message": "boom"}
    tests = {
        "test_metrics.py::test_metrics_disabled": {"llama-server": ok, "sluice": bad},
        "test_basic.py::test_new": {"llama-server": ok, "sluice": bad},
        "test_basic.py::test_both": {"llama-server": ok, "sluice": ok},
        "test_basic.py::test_ours": {"llama-server": bad, "sluice": ok},
    }
    summary = summarize(tests)
    assert summary["files"]["test_basic.py"]["sluice"] == {"passed": 2, "failed": 1,
                                                           "skipped": 0}
    assert summary["passes_llama_fails_sluice_by_class"] == {"a": 1, "?": 1}
    assert [r["test"] for r in summary["passes_sluice_fails_llama"]] == [
        "test_basic.py::test_ours"]
    assert classify("test_basic.py::test_new") == ("?", "not classified yet")
