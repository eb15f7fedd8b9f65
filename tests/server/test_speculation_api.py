"""N-gram speculation over HTTP on the synthetic model that repeats itself
(``markov_order``): the request field that turns it off, the model's ``speculation``
setting, the counters on ``/metrics`` and ``/status.json``, and bad values refused in the
API's shape."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from tests.server.live import LiveServer, config_with, metric_sum, scrape, synth_chat

PROMPT = "w5 w6 w7 w8 w9 w5 w6 w7 w10 w11 w5 w6"


def _config(**model: Any) -> Any:
    entry = {**synth_chat(markov_order=1, vocab_size=40), **model}
    return config_with(models=[entry])


def _complete(c: httpx.Client, **fields: Any) -> dict[str, Any]:
    r = c.post("/v1/completions", json={"model": "synth-chat", "prompt": PROMPT,
                                        "max_tokens": 48, "temperature": 0, **fields})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def _speculation(c: httpx.Client) -> dict[str, Any]:
    status = c.get("/status.json").json()
    entries = [m["speculation"] for w in status["workers"] for m in w["models"]
               if m["model_id"] == "synth-chat"]
    assert len(entries) == 1
    entry: dict[str, Any] = entries[0]
    return entry


def test_drafts_are_counted_and_a_request_can_turn_them_off(
        serve: Callable[..., LiveServer]) -> None:
    live = serve(_config())
    with live.client() as c:
        plain = _complete(c, speculation=False)
        assert _speculation(c)["draft_tokens"] == 0
        drafted = _complete(c)
        assert drafted["choices"][0]["text"] == plain["choices"][0]["text"]
        assert drafted["usage"] == plain["usage"]
        state = _speculation(c)
        assert state["mode"] == "auto" and state["accepted_tokens"] > 0
        assert 0 < state["acceptance"] <= 1 and state["verify_steps"] > 0
        samples = scrape(c)
        assert metric_sum(samples, "sluice_spec_draft_tokens_total",
                          model="synth-chat") == state["draft_tokens"]
        assert metric_sum(samples, "sluice_spec_accepted_tokens_total",
                          model="synth-chat") == state["accepted_tokens"]
        tally = c.get("/status.json").json()["workers"]
        buckets = [b for w in tally for m in w["models"] for k, b in m["step_times"].items()
                   if k.endswith("+draft")]
        assert sum(b["draft_tokens"] for b in buckets) == state["draft_tokens"]
        # one client, so every decode step ran one sequence: the plain request's steps
        # and the drafted one's are the gate's two arms at batch 1
        (gate,) = state["draft_gate"]
        assert gate["batch"] == 1 and isinstance(gate["drafting"], bool)
        assert gate["plain_tokens_per_s"] > 0 and gate["draft_tokens_per_s"] > 0


def test_a_model_with_speculation_off_drafts_nothing(serve: Callable[..., LiveServer]) -> None:
    live = serve(_config(speculation="off"))
    with live.client() as c:
        _complete(c)
        state = _speculation(c)
        assert state["mode"] == "off" and state["draft_tokens"] == 0
        assert state["draft_gate"] == []  # an engine that never drafts measures no arm
        assert metric_sum(scrape(c), "sluice_spec_draft_tokens_total") == 0


def test_a_bad_speculation_value_is_a_400_naming_it_and_the_server_serves_on(
        serve: Callable[..., LiveServer]) -> None:
    live = serve(_config())
    with live.client() as c:
        for value in ("sometimes", 3, [True]):
            r = c.post("/v1/chat/completions", json={
                "model": "synth-chat", "messages": [{"role": "user", "content": "hi"}],
                "speculation": value})
            assert r.status_code == 400, r.text
            assert r.json()["error"]["param"] == "speculation"
        assert _complete(c)["choices"][0]["text"]


@pytest.mark.parametrize("field,value", [("speculation", "fast"), ("draft_max", 0),
                                         ("draft_max", 65)])
def test_a_bad_model_setting_names_its_field(field: str, value: Any) -> None:
    with pytest.raises(ValidationError, match=field):
        _config(**{field: value})
