"""The command line: ``sluice models``, ``sluice chat``, and ``sluice serve`` draining on
SIGTERM (in-flight requests finish, the process exits 0)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.procs import free_port, start_serve

ROOT = Path(__file__).resolve().parent.parent
SLOW_CHAT = """
[server]
drain_timeout_s = 10
[workers]
count = 1
inbox_capacity = 8
[[models]]
id = "chat"
kind = "generative"
backend = "synthetic"
task = "generation"
memory_bytes = 1000
options = { step_fixed_s = 0.03, n_seq_max = 8, n_ctx_per_seq = 256, load_s = 0.0 }
"""


def sluice(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sluice.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def test_models_lists_the_configured_models() -> None:
    out = sluice("models", "-c", "examples/synthetic.toml")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert [ln.split("\t")[0] for ln in lines] == ["synth-a", "synth-b", "synth-chat"]
    assert "(default)" in lines[2]


def test_invalid_config_names_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(SLOW_CHAT.replace("inbox_capacity = 8", "inbox_capacity = 0"))
    out = sluice("models", "-c", str(bad))
    assert out.returncode == 2
    assert "workers.inbox_capacity" in out.stderr


def test_a_bad_isolation_or_a_process_kill_in_thread_mode_is_a_config_error(
    tmp_path: Path,
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(SLOW_CHAT.replace("count = 1", 'count = 1\nisolation = "fork"'))
    out = sluice("models", "-c", str(bad))
    assert out.returncode == 2
    assert "workers.isolation" in out.stderr and "'thread' or 'process'" in out.stderr
    bad.write_text(SLOW_CHAT + 'faults = { kill_on_calls = [3], kill_mode = "abort" }\n')
    out = sluice("models", "-c", str(bad))
    assert out.returncode == 2
    assert "kill_mode" in out.stderr and 'workers.isolation = "process"' in out.stderr


def test_serve_with_worker_processes_answers_and_stops_them_on_sigterm(
    tmp_path: Path,
) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(SLOW_CHAT.replace("0.03", "0.001").replace(
        "count = 1", 'count = 2\nisolation = "process"'))
    port = free_port()
    proc = start_serve(cfg, port)
    try:
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions",
                       json={"model": "chat", "prompt": "hi", "max_tokens": 3}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 3
        below = _descendants(proc.pid)  # the fork server, the two workers it forked, ...
        assert len(below) >= 3, below
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        end = time.monotonic() + 10  # none is left behind
        while any(_running(pid) for pid in below) and time.monotonic() < end:
            time.sleep(0.05)
        assert not [pid for pid in below if _running(pid)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


def _descendants(pid: int) -> list[int]:
    out: list[int] = []
    for child in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True,
                                text=True).stdout.split():
        out += [int(child), *_descendants(int(child))]
    return out


def _running(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    try:
        return "zombie" not in status.read_text()
    except OSError:
        return False


def test_chat_streams_a_reply(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(SLOW_CHAT.replace("0.03", "0.001"))
    out = sluice("chat", "-c", str(cfg), "hello there", "--max-tokens", "5",
                 "--temperature", "0")
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.split()) == 5 and out.stdout.strip().startswith("w")



def test_sigterm_drains_in_flight_requests_and_exits_zero(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(SLOW_CHAT)
    port = free_port()
    proc = start_serve(cfg, port)
    base = f"http://127.0.0.1:{port}"
    try:
        results: list[tuple[int, list[str]]] = []
        first_token = threading.Barrier(5)

        def stream() -> None:
            body = {"model": "chat", "prompt": "a b c", "max_tokens": 40, "stream": True}
            lines: list[str] = []
            with httpx.Client(timeout=30) as http, \
                    http.stream("POST", f"{base}/v1/completions", json=body) as resp:
                waited = False
                for line in resp.iter_lines():
                    if line.startswith("data: "):
                        lines.append(line[6:])
                        if not waited:
                            waited = True
                            first_token.wait(timeout=10)
                results.append((resp.status_code, lines))

        threads = [threading.Thread(target=stream) for _ in range(4)]
        for t in threads:
            t.start()
        first_token.wait(timeout=10)
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(30)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
    assert len(results) == 4
    for status, lines in results:
        assert status == 200
        assert lines[-1] == "[DONE]"
        chunks = [json.loads(x) for x in lines[:-1]]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert sum(1 for c in chunks if c["choices"][0]["text"]) == 40


def _gguf() -> Path:
    pytest.importorskip("llama_cpp", reason="the llm extra is not installed")
    from sluice.backends.packaged import default_gguf_path

    return default_gguf_path()


@pytest.mark.llm
def test_models_of_gguf_files_with_llama_server_flags() -> None:
    from sluice.backends.llamacpp.sizing import estimate_memory_bytes, gguf_shape

    path = _gguf()
    out = sluice("models", str(path), "-m", str(path), "--alias", "tiny",
                 "--served-model-name", "tiny2", "--ctx-size", "2048", "-np", "2")
    assert out.returncode == 0, out.stderr
    rows = [ln.split("\t") for ln in out.stdout.strip().splitlines()]
    assert [r[0] for r in rows] == ["tiny", "tiny2"]
    want = estimate_memory_bytes(path, 2048, gguf_shape(path))
    assert rows[0][4] == f"{want} bytes (default)"
    # The file's size, a quarter more for compute buffers, and 2048 cells of f16 K and V.
    shape = gguf_shape(path)
    kv = 2048 * shape["n_layer"] * shape["n_head_kv"] * (shape["key_length"]
                                                         + shape["value_length"]) * 2
    assert want == int(path.stat().st_size * 1.25) + kv
    named = sluice("models", str(path))
    assert named.stdout.startswith(path.stem + "\t")


def test_gguf_serving_errors_name_the_problem(tmp_path: Path) -> None:
    out = sluice("models", str(tmp_path / "missing.gguf"))
    assert out.returncode == 2 and "model file not found" in out.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text('[[models]]\nid = "g"\nkind = "generative"\nbackend = "llamacpp"\n'
                   'memory_bytes = 1\noptions = { n_ctxx = 1 }\n')
    out = sluice("models", "-c", str(bad))
    assert out.returncode == 2 and "unknown llamacpp option 'n_ctxx'" in out.stderr


@pytest.mark.llm
def test_serve_a_gguf_file_in_one_line() -> None:
    """``sluice serve model.gguf --alias tiny --api-key k --parallel 2 --ctx-size 2048``: the
    model is served under its alias, the key is required, the OpenAI SDK works."""
    path = _gguf()
    port = free_port()
    proc = start_serve(None, port, timeout_s=120, extra_args=(
        str(path), "--alias", "tiny", "--api-key", "sk-test", "--parallel", "2",
        "--ctx-size", "2048", "--threads", "2", "--log-level", "warning"))
    try:
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/v1/models").status_code == 401
        with openai.OpenAI(base_url=f"{base}/v1", api_key="sk-test", max_retries=0) as oai:
            assert [m.id for m in oai.models.list()] == ["tiny"]
            r = oai.completions.create(model="tiny", prompt="The capital of France is the city of",
                                       max_tokens=3, temperature=0)
            assert "Paris" in r.choices[0].text
            too_many = oai.with_options(max_retries=0).chat.completions.with_raw_response
            with pytest.raises(openai.BadRequestError, match="at most 2"):
                too_many.create(model="tiny", messages=[{"role": "user", "content": "x"}], n=3)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        assert proc.stdout is not None
        proc.stdout.close()


SECRETS = ("adm-0123456789-topsecret-admin", "met-0123456789-topsecret-metrics",
           "pw-0123456789-topsecret-redis", "sk-0123456789-topsecret-tenant-key")
SECRET_CONFIG = f"""
[server]
admin_key = "{SECRETS[0]}"
metrics_kee = "{SECRETS[1]}"
[quota]
backend = "redis"
redis_url = "redis://sluice:{SECRETS[2]}@127.0.0.1:1/0"
timeout_ms = 0
[workers]
count = 1
[[models]]
id = "chat"
kind = "generative"
backend = "synthetic"
task = "generation"
memory_bytes = 1000
options = {{ load_s = 0.0 }}
[[tenants]]
id = "acme"
api_keys = ["{SECRETS[3]}"]
priority = 1
priority_ceiling = 3
"""


def test_a_config_error_names_the_fields_and_prints_no_secret(tmp_path: Path) -> None:
    """A misspelt key field, a tenant-level error (whose input is the tenant's table, keys
    included) and an error beside a password-carrying Redis URL: every field is named, no
    part of a secret is printed; fixed, the same file serves."""
    bad = tmp_path / "bad.toml"
    bad.write_text(SECRET_CONFIG)
    out = sluice("serve", "-c", str(bad), "--port", "1")
    assert out.returncode == 2
    for secret in SECRETS:  # not even a tail of one
        assert secret[-12:] not in out.stderr + out.stdout, out.stderr
    for field in ("server.metrics_kee", "tenants.0", "priority_ceiling (3)",
                  "quota.timeout_ms", "(got 0)"):
        assert field in out.stderr, (field, out.stderr)
    good = tmp_path / "good.toml"
    good.write_text(SECRET_CONFIG.replace("metrics_kee", "metrics_key")
                    .replace("timeout_ms = 0", "timeout_ms = 250")
                    .replace("priority_ceiling = 3", "priority_ceiling = 0")
                    .replace('backend = "redis"', 'backend = "memory"'))
    port = free_port()
    proc = start_serve(good, port)
    try:
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions",
                       headers={"authorization": f"Bearer {SECRETS[3]}"},
                       json={"model": "chat", "prompt": "hi", "max_tokens": 2}, timeout=30)
        assert r.status_code == 200, r.text
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        assert proc.stdout is not None
        logged = proc.stdout.read().decode()
        proc.stdout.close()
    assert not any(secret in logged for secret in SECRETS)


@pytest.mark.llm
def test_a_folder_serves_every_gguf_in_it_each_with_a_keep_alive(tmp_path: Path) -> None:
    """``sluice serve DIR``: every model file in the folder (name order; projectors and later
    split parts skipped), Ollama's 5-minute keep-alive unless ``--keep-alive`` says; ``--pin``
    pins one; a folder without GGUFs is refused by name."""
    from sluice.cli.serve_gguf import LlamaFlags, apply_llama_flags
    from sluice.config import default_config

    path = _gguf()
    for name in ("b-model.gguf", "a-model.gguf", "mmproj-a.gguf",
                 "big-00001-of-00002.gguf", "big-00002-of-00002.gguf"):
        (tmp_path / name).symlink_to(path)
    (tmp_path / "notes.txt").write_text("not a model")
    config = apply_llama_flags(default_config(), [tmp_path], LlamaFlags(pins=("b-model",)))
    assert [m.id for m in config.models] == ["a-model", "b-model", "big-00001-of-00002"]
    assert [m.keep_alive for m in config.models] == ["5m"] * 3
    assert [m.spec().keep_alive_s for m in config.models] == [300.0, None, 300.0]
    assert [m.spec().pinned for m in config.models] == [False, True, False]
    assert config.workers.budget_bytes >= max(m.memory_bytes for m in config.models)
    quick = apply_llama_flags(default_config(), [tmp_path / "a-model.gguf"],
                              LlamaFlags(keep_alive="0"))
    assert quick.models[0].spec().keep_alive_s == 0.0
    single = apply_llama_flags(default_config(), [tmp_path / "a-model.gguf"], LlamaFlags())
    assert single.models[0].spec().keep_alive_s is None  # a file: until evicted
    empty = tmp_path / "empty"
    empty.mkdir()
    out = sluice("models", str(empty))
    assert out.returncode == 2 and "no GGUF model files in folder" in out.stderr
    out = sluice("models", str(tmp_path), "--pin", "nope")
    assert out.returncode == 2 and "--pin nope: no such model" in out.stderr
    out = sluice("models", str(tmp_path), "--keep-alive", "5x")
    assert out.returncode == 2 and "keep_alive" in out.stderr
