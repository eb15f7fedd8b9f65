"""The holes a security review found (issue 11, part 5), each closed and shown over HTTP
where a user meets it: admin routes closed without an admin key, bounded per-tenant state on
an open server, prompts measured before they are tokenized (and never on the event loop),
embeddings admitted as one unit, priority ceilings, a metrics key, sanitized 500 bodies and
bounded stop strings on ``/v1/infer``."""

from __future__ import annotations

from collections.abc import Callable

import pytest

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
