"""The serving core's admission order, through a real server: an overloaded (draining)
server refuses a constrained request without compiling its grammar, and a grammar that does
not compile after the quota reserved gives the reservation back; the server serves after."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

import sluice.server.core.generate as core_generate
from sluice.server.quota import MemoryQuotaStore
from tests.server.live import LiveServer, assert_error, config_with, synth_chat, wait_for

AUTH = {"authorization": "Bearer key-t"}
BYTE_MODEL = synth_chat(byte_tokens=True, vocab_size=300)
"""Ids 3..258 are bytes, so a JSON grammar can be decoded."""
SCHEMA_FORMAT = {"type": "json_schema",
                 "json_schema": {"name": "x", "schema": {"type": "object"}}}


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "synth-chat", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4, "temperature": 0, **extra}


def test_draining_server_refuses_before_compiling(
    serve: Callable[..., LiveServer], monkeypatch: pytest.MonkeyPatch,
) -> None:
    live = serve(config_with(models=[BYTE_MODEL]))
    compiled: list[str] = []
    real = core_generate.checked

    def spy(constraint: Any, tok: Any, param: str, *limits: Any) -> Any:
        compiled.append(param)
        return real(constraint, tok, param, *limits)

    monkeypatch.setattr(core_generate, "checked", spy)
    with live.client() as c:
        assert c.post("/v1/chat/completions",
                      json=chat(response_format=SCHEMA_FORMAT)).status_code == 200
        assert compiled == ["response_format"]
        live.runtime.begin_drain()
        r = c.post("/v1/chat/completions", json=chat(response_format=SCHEMA_FORMAT))
        assert_error(r, 503, code="draining")
        assert compiled == ["response_format"]  # refused before the grammar


def test_bad_grammar_after_quota_gives_the_reservation_back(
    serve: Callable[..., LiveServer],
) -> None:
    live = serve(config_with(
        models=[BYTE_MODEL],
        tenants=[{"id": "t", "api_keys": ["key-t"],
                  "limits": {"requests_per_s": 0.001, "burst": 2}}]))
    store = live.server.config.app.state.ctx.quota.store.inner  # type: ignore[union-attr]
    assert isinstance(store, MemoryQuotaStore)

    def level() -> float:
        state = store.state("t")
        assert state is not None and state.requests is not None
        return state.requests.tokens

    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}
    with live.client(headers=AUTH) as c:
        for _ in range(3):  # burst 2: without the refunds the third would be a 429
            assert_error(c.post("/v1/chat/completions", json=chat(response_format=bad)),
                         400, param="response_format")
            wait_for(lambda: math.isclose(level(), 2.0, abs_tol=0.05))
        r = c.post("/v1/chat/completions", json=chat())
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["role"] == "assistant"
