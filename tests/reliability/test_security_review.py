"""The holes a security review found (issue 11, part 5), each closed and shown over HTTP
where a user meets it: admin routes closed without an admin key, bounded per-tenant state on
an open server, prompts measured before they are tokenized (and never on the event loop),
embeddings admitted as one unit, priority ceilings, a metrics key, sanitized 500 bodies and
bounded stop strings on ``/v1/infer``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from sluice.config import TenantConfig
from sluice.server.schemas import MAX_STOP, MAX_STOP_CHARS
from tests.server.live import LiveServer, assert_error, config_with, synth_chat, synth_embed

CHAT = "synth-chat"


@pytest.fixture(scope="module")
def live(serve_module: Callable[..., LiveServer]) -> LiveServer:
    return serve_module(config_with(models=[synth_chat(), synth_embed()],
                                    workers={"count": 1}))


@pytest.mark.parametrize("stop", [
    ["x" * (MAX_STOP_CHARS + 1)], [""], ["a"] * (MAX_STOP + 1),
])
def test_infer_stop_strings_have_chats_bounds(live: LiveServer, stop: list[str]) -> None:
    with live.client() as c:
        for path, body in (("/v1/infer", {"model": CHAT, "input": "hi", "stop": stop}),
                           ("/v1/chat/completions", {
                               "model": CHAT, "stop": stop,
                               "messages": [{"role": "user", "content": "hi"}]})):
            assert_error(c.post(path, json=body), 400, code="invalid_value", param="stop")
        ok = c.post("/v1/infer", json={"model": CHAT, "input": "hi", "max_new_tokens": 2,
                                       "stop": ["x" * MAX_STOP_CHARS] * MAX_STOP})
        assert ok.status_code == 200, ok.text


# -- priority: a tenant may lower its priority, never raise it past its ceiling ------------


def _served_priority(c: httpx.Client, body: dict[str, Any] | None = None,
                     headers: dict[str, str] | None = None) -> int:
    r = c.post("/v1/infer", json={"model": CHAT, "input": "hi", "max_new_tokens": 1,
                                  **(body or {})}, headers=headers or {})
    assert r.status_code == 200, r.text
    return int(r.headers["x-sluice-priority"])


def test_a_tenant_cannot_raise_its_priority_past_its_ceiling(
    serve: Callable[..., LiveServer],
) -> None:
    live = serve(config_with(
        models=[synth_chat()], workers={"count": 1},
        tenants=[{"id": "plain", "api_keys": ["sk-plain"], "priority": 5},
                 {"id": "vip", "api_keys": ["sk-vip"], "priority": 4, "priority_ceiling": 1}]))
    with live.client(headers={"authorization": "Bearer sk-plain"}) as c:
        assert _served_priority(c) == 5
        assert _served_priority(c, {"priority": 0}) == 5  # the body cannot raise it
        assert _served_priority(c, headers={"x-sluice-priority": "0"}) == 5  # nor a header
        assert _served_priority(c, {"priority": 8}) == 8  # lowering is fine
        assert _served_priority(c, headers={"x-sluice-priority": "9"}) == 9
    with live.client(headers={"authorization": "Bearer sk-vip"}) as c:
        assert _served_priority(c) == 4
        assert _served_priority(c, {"priority": 0}) == 1
        assert _served_priority(c, {"priority": 2}) == 2
        assert _served_priority(c, headers={"x-sluice-priority": "0"}) == 1


def test_unconfigured_tenants_get_the_default_tenants_ceiling(
    serve: Callable[..., LiveServer],
) -> None:
    live = serve(config_with(models=[synth_chat()], workers={"count": 1},
                             tenants=[{"id": "default", "priority": 6},
                                      {"id": "ops", "priority": 3, "priority_ceiling": 0}]))
    with live.client() as c:
        assert _served_priority(c, {"priority": 0}) == 6
        assert _served_priority(c, {"priority": 0}, {"x-tenant-id": "stranger"}) == 6
        assert _served_priority(c, {"priority": 0, "tenant_id": "stranger"}) == 6
        assert _served_priority(c, {"priority": 0}, {"x-tenant-id": "ops"}) == 0
        assert _served_priority(c, {"priority": 0, "tenant_id": "ops"}) == 0


def test_a_ceiling_below_the_default_priority_is_refused() -> None:
    with pytest.raises(ValueError, match="priority_ceiling"):
        TenantConfig(id="x", priority=2, priority_ceiling=3)
