"""The second security review (issue 28), each finding closed and shown over the real
transport where a user meets it, and the server serving a real request after the hostile
one: the OpenAPI pages off by default, configuration errors that never print a secret,
unauthenticated claims of a tenant, and the operational endpoints once tenants have keys."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from tests.server.live import LiveServer, assert_error, config_with, synth_chat

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
