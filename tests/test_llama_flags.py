"""``sluice serve`` with llama-server's flags: each maps to the configuration or is refused
by name (exit 2, a message, no traceback), and a real server started with several of them
serves what they say."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from sluice.backends.base import thinking_default
from sluice.cli import serve_config
from sluice.cli.serve_gguf import LlamaFlags
from tests.procs import free_port, start_serve

ROOT = Path(__file__).resolve().parent.parent


def _gguf() -> Path:
    pytest.importorskip("llama_cpp", reason="the llm extra is not installed")
    from sluice.backends.packaged import default_gguf_path

    return default_gguf_path()


def sluice(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sluice.cli", *args], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)


@pytest.mark.llm
def test_llama_server_flags_map_to_the_config(tmp_path: Path) -> None:
    path = _gguf()
    config = serve_config([
        str(path), "--alias", "tiny,tiny-b", "-c", "2048", "-np", "2", "-t", "1",
        "--temp", "0", "--seed", "42", "-n", "64", "--embedding", "--pooling", "last",
        "--host", "127.0.0.1,::1", "--port", "0", "--api-key", "k1,k2", "--api-key", "k3",
        "--cors-origins", "http://a.test,http://b.test", "--slot-save-path", str(tmp_path),
        "--no-repack", "--kv-unified", "--jinja", "--no-context-shift", "--cont-batching",
        "--metrics", "--slots"])
    [model] = config.models
    assert model.id == "tiny" and config.server.model_aliases == {"tiny-b": "tiny"}
    assert {k: model.options[k] for k in ("n_ctx", "n_seq_max", "n_threads", "extra_bufts",
                                          "kv_unified")} == {
        "n_ctx": 2048, "n_seq_max": 2, "n_threads": 1, "extra_bufts": False,
        "kv_unified": True}
    assert model.sampling.given() == {"temperature": 0.0, "seed": 42}
    assert model.sampling.over_model_file  # a flag wins over the file, as in llama-server
    assert model.default_max_tokens == 64
    assert model.embeddings is not None and model.embeddings.pooling == "last"
    assert [s.model_id for s in model.specs()] == ["tiny", "tiny:embedding"]
    for flags in (["--reranking"], ["--embedding", "--pooling", "rank"]):  # llama-server's
        [ranker] = serve_config([str(path), *flags]).models
        assert ranker.embedding_id is None and ranker.rerank_id == f"{ranker.id}:rerank"
        assert [(s.model_id, s.task) for s in ranker.specs()][1] == (ranker.rerank_id,
                                                                     "rerank")
    assert config.server.hosts == ["127.0.0.1", "::1"]
    assert config.server.cors_origins == ["http://a.test", "http://b.test"]
    assert config.server.slot_save_path == str(tmp_path)
    [tenant] = config.tenants
    assert tenant.api_keys == ["k1", "k2", "k3"]
    # -c is a config file unless it is a number; --seed -1 is each request's own seed
    synthetic = serve_config(["-c", "examples/synthetic.toml", "--seed", "-1"])
    assert [m.id for m in synthetic.models] == ["synth-a", "synth-b", "synth-chat"]
    gen = serve_config([str(path), "--n-predict", "-1", "--seed", "-1"]).models[0]
    assert gen.default_max_tokens == -1 and "seed" not in gen.sampling.given()
    assert config.server.slots_endpoint is True
    assert serve_config([str(path), "--no-slots"]).server.slots_endpoint is False
    assert config.server.web_ui is True
    assert serve_config([str(path), "--no-ui"]).server.web_ui is False
    assert serve_config([str(path), "--no-webui"]).server.web_ui is False
    assert config.engine.cache_ram_mib == 1024  # llama-server's --cache-ram, in MiB
    for flag, mib, ram in (("--cache-ram", "0", 0), ("-cram", "-1", None),
                           ("--cache-ram", "64", 64 << 20)):
        cached = serve_config([str(path), flag, mib])
        assert cached.engine.cache_ram_mib == int(mib)
        assert cached.runtime_config().workers[0].engine.cache_ram_bytes == ram
    assert config.server.unknown_model == "refuse"
    assert serve_config([str(path), "--unknown-model", "default"]).server.unknown_model == (
        "default")


def test_reasoning_flags_set_each_models_reasoning_table() -> None:
    """``--reasoning on|off`` sets the default a template sees as ``enable_thinking`` (over a
    config's table, keeping its tags); ``auto`` leaves each model's own; a budget makes a
    table only when it limits something."""
    tags = {"start": "<t>", "end": "</t>"}
    assert LlamaFlags(reasoning="on").reasoning_table(None) == {"enabled": True}
    assert LlamaFlags(reasoning="off").reasoning_table(tags) == {**tags, "enabled": False}
    assert LlamaFlags(reasoning="auto").reasoning_table(tags) == tags
    assert LlamaFlags(reasoning="auto").reasoning_table(None) is None
    assert LlamaFlags().reasoning_table(None) is None
    assert LlamaFlags(reasoning_budget=-1).reasoning_table(None) is None
    assert LlamaFlags(reasoning_budget=-1).reasoning_table({"budget_tokens": 9}) == {
        "budget_tokens": None}
    assert LlamaFlags(reasoning_budget=0).reasoning_table(None) == {"budget_tokens": 0}
    assert LlamaFlags(reasoning="off", reasoning_budget=64).reasoning_table(None) == {
        "enabled": False, "budget_tokens": 64}


@pytest.mark.llm
def test_reasoning_flags_reach_the_model_spec() -> None:
    path = str(_gguf())
    plain = serve_config([path]).models[0]
    assert plain.reasoning is None and thinking_default(plain.spec().reasoning) is True
    for value, enabled in (("off", False), ("0", False), ("on", True), ("enabled", True)):
        spec = serve_config([path, "--reasoning", value, "--reasoning-format", "deepseek"]
                            ).models[0].spec()
        assert spec.reasoning is not None and spec.reasoning.enabled is enabled
        assert thinking_default(spec.reasoning) is enabled
    budget = serve_config([path, "-rea", "auto", "--reasoning-budget", "32"]).models[0]
    assert budget.reasoning is not None and budget.reasoning.budget_tokens == 32
    assert serve_config([path, "--reasoning", "auto"]).models[0].reasoning is None


@pytest.mark.llm
@pytest.mark.parametrize(("args", "message"), [
    (["--context-shift"], "--context-shift: sluice does not shift a full context"),
    (["--props"], "--props: sluice does not change its settings at run time"),
    (["--pooling", "none"], "--pooling none: per-token embeddings are not served"),
    (["--pooling", "mean"], "--pooling mean: embeddings are off (add --embedding)"),
    (["--n-predict", "0"], "--n-predict 0: give -1"),
    (["--chat-template", "{% for m in messages %}"],
     "--chat-template: the template text is not a usable Jinja template"),
    (["--chat-template", "chatm1"], "--chat-template: 'chatm1' is not a llama.cpp template"),
    (["--alias", "a,,b"], "--alias 'a,,b': an empty name"),
    (["--host", "127.0.0.1,"], "server.host: an empty address"),
    (["--ubatch-size", "8"], "unrecognized arguments: --ubatch-size 8"),
    (["--reasoning", "maybe"], "--reasoning: give on, off or auto, not 'maybe'"),
    (["--reasoning-budget", "-2"], "--reasoning-budget -2: give -1 (no limit)"),
    (["--reasoning-format", "none"], "--reasoning-format none: sluice returns a thinking "
                                     "model's thinking apart"),
    (["--reasoning-format", "deepseek-legacy"], "--reasoning-format deepseek-legacy: sluice "
                                                "does not also leave the <think> tags"),
])
def test_flags_without_a_meaning_are_refused_by_name(args: list[str], message: str) -> None:
    out = sluice("serve", str(_gguf()), "--port", "1", *args)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.llm
def test_alias_tags_and_verbose_flags() -> None:
    """``--alias a,b,c`` names the model by the alphabetically first name, as llama-server
    does (its aliases are a set); ``--served-model-name`` by the first, as vLLM does;
    ``--tags`` label it; ``--verbose`` turns on ``__verbose`` answers."""
    path = str(_gguf())
    config = serve_config([path, "--alias", "tinyllama-2,fim,code", "--tags", "chat,fim",
                           "--tags", "small", "--verbose"])
    [model] = config.models
    assert model.id == "code" and model.tags == ["chat", "fim", "small"]
    assert config.server.model_aliases == {"tinyllama-2": "code", "fim": "code"}
    assert config.server.verbose_answers
    config = serve_config([path, "--served-model-name", "tinyllama-2,fim"])
    assert config.models[0].id == "tinyllama-2" and not config.server.verbose_answers
    assert config.models[0].tags == []


@pytest.mark.llm
def test_a_server_started_with_llama_server_flags_serves_them() -> None:
    """Template text given to ``--chat-template`` is the template (it was taken for a name,
    and the model failed to load); ``--n-predict`` is the limit of a request that names none;
    ``--temp`` is the default in force; every ``--host`` answers; an ``--alias`` name serves;
    the key is required."""
    path = _gguf()
    port = free_port()
    template = "This is not a chat template, it is"  # llama.cpp's suite: text, not a name
    proc = start_serve(None, port, timeout_s=120, extra_args=(
        str(path), "--alias", "tiny,tiny-b", "--host", "127.0.0.1,::1", "--temp", "0",
        "--seed", "7", "-n", "5", "-c", "1024", "-np", "2", "-t", "2", "--jinja",
        "--chat-template", template, "--api-key", "sk-a,sk-b", "--no-context-shift",
        "--log-level", "warning"))
    try:
        auth = {"authorization": "Bearer sk-b"}
        with httpx.Client(timeout=60, headers=auth) as http:
            v4, v6 = f"http://127.0.0.1:{port}", f"http://[::1]:{port}"
            assert httpx.get(f"{v6}/v1/models").status_code == 401
            [entry] = http.get(f"{v6}/v1/models").json()["data"]
            assert entry["id"] == "tiny"
            assert entry["sampling_defaults"]["temperature"] == 0.0
            assert entry["sampling_defaults_from"]["temperature"] == "config"
            r = http.post(f"{v4}/v1/chat/completions", json={
                "model": "tiny-b", "messages": [{"role": "user", "content": "Name a colour."}]})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["choices"][0]["finish_reason"] == "length"
            assert body["usage"]["completion_tokens"] == 5
            # the chat's prompt is the template's text, rendered (here: the text itself)
            tokens = http.post(f"{v4}/tokenize", json={
                "model": "tiny", "messages": [{"role": "user", "content": "Name a colour."}]})
            assert tokens.status_code == 200, tokens.text
            ids = tokens.json()["tokens"]
            assert body["usage"]["prompt_tokens"] == len(ids)
            text = http.post(f"{v4}/detokenize", json={"model": "tiny", "tokens": ids})
            assert text.json()["content"] == template
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        assert proc.stdout is not None
        proc.stdout.close()
