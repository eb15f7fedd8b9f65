"""Security basics: API keys held only as digests and compared in constant time; no
prompt or completion text in the logs unless ``server.log_content`` is set; admin routes
need the admin key whenever one is configured; ``sluice serve`` binds 127.0.0.1 unless
told otherwise. (Body and header size limits are rows of the bad-input table.)"""

from __future__ import annotations

import hmac
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.requests import Request

from sluice.config import ServerConfig, TenantConfig, default_config, hash_key
from sluice.server import auth as auth_module
from sluice.server.auth import Auth
from sluice.server.errors import APIError
from tests.reliability.rawhttp import http_bytes, raw_request
from tests.server.live import LiveServer, assert_error, config_with, synth_chat, synth_embed

ROOT = Path(__file__).resolve().parents[2]
KEYS = {"acme": ["sk-acme-one", "sk-acme-two"], "beta": ["sk-beta-one"]}
ADMIN = "adm-very-secret"


def _tenants() -> list[TenantConfig]:
    return [TenantConfig(id=t, api_keys=keys) for t, keys in KEYS.items()]


def _request(headers: dict[str, str]) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": raw})


def _reachable(obj: Any, seen: set[int] | None = None) -> Iterator[Any]:
    """Every value reachable from ``obj`` through attributes and containers."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    yield obj
    if isinstance(obj, str | bytes | int | float | bool | type(None)):
        return
    if isinstance(obj, dict):
        children: list[Any] = [*obj.keys(), *obj.values()]
    elif isinstance(obj, list | tuple | set | frozenset):
        children = list(obj)
    else:
        children = list(getattr(obj, "__dict__", {}).values())
        children += [getattr(obj, s) for s in getattr(type(obj), "__slots__", ())
                     if hasattr(obj, s)]
        if hasattr(obj, "model_dump"):
            children.append(obj.model_dump())
    for child in children:
        yield from _reachable(child, seen)


def test_auth_holds_only_digests_of_the_keys() -> None:
    auth = Auth(_tenants(), ADMIN)
    plain = {k for keys in KEYS.values() for k in keys} | {ADMIN}
    for value in _reachable(auth):
        if isinstance(value, str | bytes):
            text = value.decode("latin-1") if isinstance(value, bytes) else value
            assert not any(k in text for k in plain), f"a plain key is held: {value!r}"
    digests = {v for v in _reachable(auth) if isinstance(v, bytes)}
    assert {hash_key(k).encode() for k in plain} <= digests
    assert not any(k in repr(auth.__dict__) for k in plain)
    # the tenant a request resolves to carries no keys either
    assert auth.tenant(_request({"authorization": "Bearer sk-beta-one"})).api_keys == []


def test_every_key_check_goes_through_compare_digest_with_no_early_exit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth_module.hmac, "compare_digest", spy)
    auth = Auth(_tenants(), ADMIN)
    n_keys = sum(len(k) for k in KEYS.values())
    for key, tenant in (("sk-acme-one", "acme"), ("sk-beta-one", "beta"), ("nope", None)):
        calls.clear()
        if tenant is None:
            with pytest.raises(APIError):
                auth.tenant(_request({"authorization": f"Bearer {key}"}))
        else:
            assert auth.tenant(_request({"authorization": f"Bearer {key}"})).id == tenant
        # the first key matches or none does: every stored digest is compared all the same
        assert len(calls) == n_keys
        assert all(b == hash_key(key).encode() for _, b in calls)
    calls.clear()
    auth.require_admin(_request({"x-admin-key": ADMIN}))
    assert len(calls) == 1
    with pytest.raises(APIError):
        auth.require_admin(_request({"x-admin-key": "guess"}))


SECRET_PROMPT = "zebra-papaya-4711 confidential words"


@pytest.mark.parametrize("log_content", [False, True])
def test_no_prompt_or_completion_in_the_logs_unless_log_content(
    serve: Callable[..., LiveServer], caplog: pytest.LogCaptureFixture, log_content: bool,
) -> None:
    caplog.set_level(logging.DEBUG)
    live = serve(config_with(
        models=[synth_chat(), synth_embed(), synth_chat("bad", fail_on_calls=[1])],
        workers={"count": 1},
        tenants=[{"id": "acme", "api_keys": ["sk-log-key"]}],
        server={"log_content": log_content, "default_model": "synth-chat"}))
    headers = {"authorization": "Bearer sk-log-key"}
    completions = []
    with live.client(headers=headers) as c:
        for stream in (False, True):
            r = c.post("/v1/chat/completions", json={
                "model": "synth-chat", "messages": [{"role": "user", "content": SECRET_PROMPT}],
                "max_tokens": 6, "stream": stream, "temperature": 0})
            assert r.status_code == 200
            if not stream:
                completions.append(r.json()["choices"][0]["message"]["content"])
        assert c.post("/v1/embeddings", json={"model": "synth-a",
                                              "input": SECRET_PROMPT}).status_code == 200
        assert c.post("/v1/infer", json={"model": "bad", "input": SECRET_PROMPT}
                      ).status_code == 500
        ignored = c.post("/v1/infer", json={"model": "synth-chat", "input": SECRET_PROMPT,
                                             "frobnicate": SECRET_PROMPT})
        assert ignored.status_code == 200  # ignored; its name logged, never its value
        assert ignored.headers["x-sluice-ignored-fields"] == "frobnicate"
        assert c.post("/v1/infer", json={"model": "synth-chat", "input": SECRET_PROMPT},
                      headers={"authorization": "Bearer sk-wrong-key"}).status_code == 401
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert caplog.records, "the server logged nothing at DEBUG: the check would be empty"
    assert "zebra-papaya" not in logged  # prompts are never logged
    assert "sk-log-key" not in logged and "sk-wrong-key" not in logged
    completion = completions[0].strip()
    assert len(completion) > 5
    assert (completion in logged) is log_content


def test_admin_routes_need_the_admin_key_when_one_is_configured(
    serve: Callable[..., LiveServer],
) -> None:
    live = serve(config_with(models=[synth_chat(), synth_embed()], workers={"count": 1},
                             server={"admin_key": ADMIN, "default_model": "synth-chat",
                                     "openapi": True}))
    with live.client() as c:
        paths = c.get("/openapi.json").json()["paths"]
        admin_paths = [p for p in paths if p.startswith("/admin")]
        assert admin_paths, "no admin routes found"
        for path in admin_paths:
            for action in ("load", "unload"):
                url = path.replace("{model_id}", "synth-a").replace("{action}", action)
                for headers in ({}, {"x-admin-key": "wrong"}, {"authorization": "Bearer x"}):
                    assert_error(c.post(url, headers=headers), 401, code="invalid_admin_key")
                r = c.post(url, headers={"x-admin-key": ADMIN})
                assert r.status_code == 200, r.text


def test_default_bind_address_is_loopback() -> None:
    assert ServerConfig().host == "127.0.0.1"
    assert default_config().server.host == "127.0.0.1"


def test_sluice_serve_listens_on_127_0_0_1_unless_told(tmp_path: Path) -> None:
    """The real command, with a config that names no host."""
    cfg = tmp_path / "c.toml"
    cfg.write_text("""
[workers]
count = 1
[[models]]
id = "chat"
kind = "generative"
backend = "synthetic"
task = "generation"
memory_bytes = 1000
options = { load_s = 0.0 }
""")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sluice.cli", "serve", "-c", str(cfg), "--port", "0",
         "--log-level", "info"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, env={**env, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        end = time.monotonic() + 30
        match = None
        while time.monotonic() < end and match is None:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            match = re.search(r"Uvicorn running on http://([0-9.]+):(\d+)", line)
        assert match is not None, "".join(lines)
        assert match.group(1) == "127.0.0.1"
        base = f"http://127.0.0.1:{match.group(2)}"
        r = httpx.get(f"{base}/health", timeout=5)
        assert r.status_code == 200
        # the CLI's limits: request head over 64 KiB → 400 from uvicorn/h11; body → 413
        big_head = raw_request(base, http_bytes("POST", "/v1/completions", b"{}",
                                                {"x-padding": "p" * 100_000}))
        assert big_head.status == 400
        r = httpx.post(f"{base}/v1/completions", content=b"x" * 1_100_000,
                       headers={"content-type": "application/json"}, timeout=10)
        assert_error(r, 413, code="body_too_large")
        assert httpx.get(f"{base}/health", timeout=5).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()
    assert proc.returncode == 0
