"""A client's decoding constraint costs no more than the server's limits allow, through a
real server: a schema past its size, nesting or alternatives, or one whose compile takes
too long, is a 400 ``constraint_limit_exceeded`` naming the setting (never a 500); a tenant
past its rate limit is refused before its schema is compiled; and the server serves a plain
constrained request afterwards."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

import sluice.server.core.generate as core_generate
from tests.server.live import LiveServer, assert_error, config_with, synth_chat

BYTE_MODEL = synth_chat(byte_tokens=True, vocab_size=300)
"""Ids 3..258 are bytes, so a JSON grammar can be decoded."""
SMALL = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
         "additionalProperties": False}


def chat(schema: Any, **extra: Any) -> dict[str, Any]:
    return {"model": "synth-chat", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 24, "temperature": 0, **extra,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "x", "schema": schema}}}


def branches(tag: int, n: int) -> dict[str, Any]:
    """A flat ``anyOf`` of ``n`` one-property objects (about 120 bytes a branch)."""
    return {"anyOf": [{"type": "object", "properties": {f"k{tag}_{j}": {"type": "string"}},
                       "required": [f"k{tag}_{j}"]} for j in range(n)]}


def nested(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "integer"}
    for _ in range(depth):
        node = {"type": "object", "properties": {"a": node}}
    return node


def serves_a_constrained_request(c: httpx.Client, **headers: str) -> None:
    r = c.post("/v1/chat/completions", json=chat(SMALL), headers=headers)
    assert r.status_code == 200, r.text
    assert set(json.loads(r.json()["choices"][0]["message"]["content"])) == {"a"}


@pytest.mark.parametrize(("schema", "limit"), [
    (branches(1, 2_000), "max_schema_bytes"),
    (nested(40), "max_schema_depth"),  # 80 levels of JSON
    (branches(2, 600) | {"enum": list(range(500))}, "max_schema_alternatives"),
])
def test_a_schema_past_a_limit_is_a_400_naming_it(serve: Callable[..., LiveServer],
                                                  schema: dict[str, Any], limit: str) -> None:
    live = serve(config_with(models=[BYTE_MODEL]))
    with live.client() as c:
        err = assert_error(c.post("/v1/chat/completions", json=chat(schema)), 400,
                           code="constraint_limit_exceeded", param="response_format")
        assert f"constraints.{limit}" in err["message"], err
        serves_a_constrained_request(c)


def test_the_limits_are_configuration(serve: Callable[..., LiveServer]) -> None:
    """Raised limits admit what the defaults refuse; a compile slower than
    ``max_compile_ms`` is refused and not kept (the next try compiles again)."""
    wide = serve(config_with(models=[BYTE_MODEL], constraints={
        "max_schema_bytes": 1_000_000, "max_schema_alternatives": 5_000}))
    slow = serve(config_with(models=[BYTE_MODEL], constraints={"max_compile_ms": 0.001}))
    with wide.client() as c:
        r = c.post("/v1/chat/completions", json=chat(branches(3, 1_200)))
        assert r.status_code == 200, r.text
    with slow.client() as c:
        for _ in range(2):
            err = assert_error(c.post("/v1/chat/completions", json=chat(branches(4, 20))), 400,
                               code="constraint_limit_exceeded", param="response_format")
            assert "constraints.max_compile_ms" in err["message"]
    with wide.client() as c:
        serves_a_constrained_request(c)


def test_a_tenant_past_its_rate_is_refused_before_its_schema_compiles(
        serve: Callable[..., LiveServer], monkeypatch: pytest.MonkeyPatch) -> None:
    live = serve(config_with(models=[BYTE_MODEL], tenants=[
        {"id": "t", "api_keys": ["key-t"], "limits": {"requests_per_s": 0.01, "burst": 1}},
        {"id": "u", "api_keys": ["key-u"]}]))
    compiled: list[str] = []
    real = core_generate.checked

    def spy(constraint: Any, tok: Any, param: str, *limits: Any) -> Any:
        compiled.append(constraint.spec[:20])
        return real(constraint, tok, param, *limits)

    monkeypatch.setattr(core_generate, "checked", spy)
    with live.client(headers={"authorization": "Bearer key-t"}) as c:
        first = c.post("/v1/chat/completions", json=chat(branches(5, 500)))
        assert first.status_code == 200, first.text
        for tag in range(6, 10):  # distinct schemas: nothing to find in a cache
            assert_error(c.post("/v1/chat/completions", json=chat(branches(tag, 500))), 429,
                         code="quota")
    assert len(compiled) == 1
    with live.client() as c:
        serves_a_constrained_request(c, authorization="Bearer key-u")


def test_completions_take_response_format_and_its_limits(
        serve: Callable[..., LiveServer]) -> None:
    """``/v1/completions`` constrains by ``response_format`` as chat does, limits included:
    the field was dropped as unknown, so a 320 KB schema was neither refused nor followed."""
    live = serve(config_with(models=[BYTE_MODEL]))
    fmt = chat(SMALL)["response_format"]
    body = {"model": "synth-chat", "prompt": "hi", "max_tokens": 24, "temperature": 0}
    with live.client() as c:
        err = assert_error(c.post("/v1/completions", json=body | {"response_format": {
            **fmt, "json_schema": {"name": "x", "schema": branches(5, 2_000)}}}), 400,
            code="constraint_limit_exceeded", param="response_format")
        assert "constraints.max_schema_bytes" in err["message"], err
        r = c.post("/v1/completions", json=body | {"response_format": fmt})
        assert r.status_code == 200, r.text
        assert set(json.loads(r.json()["choices"][0]["text"])) == {"a"}
