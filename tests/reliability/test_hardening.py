"""The second security review (issue 28), each finding closed and shown over the real
transport where a user meets it, and the server serving a real request after the hostile
one: the OpenAPI pages off by default, configuration errors that never print a secret,
unauthenticated claims of a tenant, and the operational endpoints once tenants have keys."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from sluice.server.auth import NO_KEYS_REQUIRED
from tests.reliability.test_security_review import SECRET_DIR, _LeakyBackend
from tests.server.live import (
    ROOT,
    SYNTHETIC_TOML,
    LiveServer,
    assert_error,
    config_with,
    metric_sum,
    scrape,
    synth_chat,
)

CHAT = "synth-chat"


def _serves(c: httpx.Client, **headers: str) -> None:
    """A real request is served."""
    r = c.post("/v1/completions", headers=headers,
               json={"model": CHAT, "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("enabled", [False, True])
def test_the_openapi_pages_are_off_unless_enabled(serve: Callable[..., LiveServer],
                                                  enabled: bool) -> None:
    server = {"openapi": True} if enabled else {}
    live = serve(config_with(models=[synth_chat()], workers={"count": 1}, server=server))
    with live.client() as c:
        for path in ("/openapi.json", "/docs", "/redoc", "/docs/oauth2-redirect"):
            r = c.get(path)
            if enabled:
                assert r.status_code == 200, (path, r.text)
            else:
                assert_error(r, 404)
        if enabled:
            assert "/admin/models/{model_id}/{action}" in c.get("/openapi.json").json()["paths"]
        _serves(c)


# -- /metrics and /status.json: closed once tenants have keys, unless a key or a choice opens them


TENANTS = [{"id": "acme", "api_keys": ["sk-acme"], "limits": {"requests_per_s": 50}},
           {"id": "beta", "api_keys": ["sk-beta"]}]
ACME = {"authorization": "Bearer sk-acme"}
OPS = ("/metrics", "/status.json")


def _ops_config(**server: Any) -> Any:
    return config_with(models=[synth_chat()], workers={"count": 1}, tenants=TENANTS,
                       server=server)


def test_tenant_keys_without_a_metrics_key_close_metrics_and_status(
        serve: Callable[..., LiveServer], caplog: pytest.LogCaptureFixture) -> None:
    """A tenant's key opens nothing: the numbers show every tenant's traffic. The start-up
    log says how to open them."""
    caplog.set_level(logging.WARNING, logger="sluice.server")
    live = serve(_ops_config())
    warned = [r.getMessage() for r in caplog.records if "/metrics" in r.getMessage()]
    assert warned and "server.metrics_key" in warned[0] and "open_metrics" in warned[0]
    with live.client() as c:
        for path in OPS:
            for headers in ({}, ACME, {"x-metrics-key": "anything"}):
                err = assert_error(c.get(path, headers=headers), 403, code="metrics_disabled")
                assert "server.metrics_key" in err["message"]
        _serves(c, **ACME)
        assert c.get("/health").status_code == 200  # probes stay open


def test_a_metrics_key_or_open_metrics_opens_them(serve: Callable[..., LiveServer]) -> None:
    keyed = serve(_ops_config(metrics_key="mk-ops"))
    opened = serve(_ops_config(open_metrics=True))
    with keyed.client() as c:
        for path in OPS:
            assert_error(c.get(path, headers=ACME), 401, code="invalid_metrics_key")
            assert c.get(path, headers={"authorization": "Bearer mk-ops"}).status_code == 200
        _serves(c, **ACME)
    with opened.client() as c:
        for path in OPS:
            assert c.get(path).status_code == 200
        _serves(c, **ACME)


def test_status_json_redacts_the_paths_of_load_errors(serve: Callable[..., LiveServer]) -> None:
    live = serve(config_with(
        models=[synth_chat(), synth_chat("leaky-load")], workers={"count": 1},
        server={"default_model": CHAT}), backends={"synthetic": _LeakyBackend()})
    with live.client() as c:
        assert_error(c.post("/v1/infer", json={"model": "leaky-load", "input": "hi"}), 503,
                     code="model_load_failed")
        status = c.get("/status.json")
        assert status.status_code == 200
        failed = status.json()["workers"][0]["failed_models"]
        assert set(failed) == {"leaky-load"}
        assert "<path>" in failed["leaky-load"], failed
        assert SECRET_DIR not in status.text and "weights.gguf" not in status.text
        _serves(c)


# -- tenants with limits and no keys: a warning, and server.require_keys ---------------------


def test_limits_without_keys_are_warned_about(serve: Callable[..., LiveServer],
                                              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="sluice.server")
    live = serve(config_with(models=[synth_chat()], workers={"count": 1}, tenants=[
        {"id": "paying", "limits": {"requests_per_s": 100}}, {"id": "free"}]))
    [warning] = [r.getMessage() for r in caplog.records if "X-Tenant-ID" in r.getMessage()]
    assert "['paying']" in warning and "server.require_keys" in warning
    with live.client() as c:
        _serves(c, **{"x-tenant-id": "paying"})


def test_require_keys_refuses_to_start_without_keys_and_needs_one_with(
        serve: Callable[..., LiveServer], tmp_path: Path) -> None:
    """Without a key, ``sluice serve`` exits 2 naming the setting (a server would be open to
    any claim); with keys, a request without one is 401."""
    config = tmp_path / "open.toml"
    config.write_text(SYNTHETIC_TOML.read_text().replace(
        "[server]\n", "[server]\nrequire_keys = true\n", 1))
    out = subprocess.run([sys.executable, "-m", "sluice.cli", "serve", "-c", str(config),
                          "--port", "0"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 2, out.stderr
    assert NO_KEYS_REQUIRED in out.stderr
    live = serve(_ops_config(require_keys=True, open_metrics=True))
    with live.client() as c:
        r = c.post("/v1/completions", headers={"x-tenant-id": "acme"},
                   json={"model": CHAT, "prompt": "hi", "max_tokens": 2})
        assert_error(r, 401)
        _serves(c, **ACME)


# -- prefix reuse stays within a tenant unless shared ----------------------------------------


SYSTEM = " ".join(f"rule{i}" for i in range(48))  # 48 words: 48 synthetic tokens


def _hits(c: httpx.Client) -> float:
    return metric_sum(scrape(c), "sluice_prefix_cache_hits_total")


@pytest.mark.parametrize("shared", [False, True])
def test_prefix_reuse_is_keyed_by_tenant_unless_shared(serve: Callable[..., LiveServer],
                                                       shared: bool) -> None:
    """Tenant A's prompt leaves its KV retained; B sending the same prompt reuses none of it
    by default (a faster first token would tell B how A's prompt begins), A itself does;
    with ``engine.share_prefix_across_tenants`` B reuses it too."""
    live = serve(config_with(
        models=[synth_chat()], workers={"count": 1}, tenants=TENANTS,
        engine={"share_prefix_across_tenants": shared}, server={"open_metrics": True}))
    beta = {"authorization": "Bearer sk-beta"}

    def ask(c: httpx.Client, headers: dict[str, str], tail: str) -> None:
        r = c.post("/v1/completions", headers=headers,
                   json={"model": CHAT, "prompt": f"{SYSTEM} {tail}", "max_tokens": 2})
        assert r.status_code == 200, r.text

    with live.client() as c:
        ask(c, ACME, "first question")
        before = _hits(c)
        ask(c, beta, "another question")
        after_beta = _hits(c)
        ask(c, ACME, "second question")
        after_acme = _hits(c)
    assert after_acme - after_beta >= 48  # A reuses its own prefix either way
    assert (after_beta - before >= 48) is shared, (before, after_beta)
