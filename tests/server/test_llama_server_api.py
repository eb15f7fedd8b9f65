"""llama-server's habits on the OpenAI routes, over HTTP against a real uvicorn server on
the synthetic backend: its paths without ``/v1``, ``model`` optional, unknown names refused
or served by the one model (configurable), aliases, CORS only when configured, ``grammar``
and top-level ``json_schema`` constraining the output, and ``/health`` failing (requests
503) when the model failed to load."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from tests.server.live import LiveServer, assert_error, config_with, synth_chat, synth_embed

CHAT, BYTES = "chat", "bytes"
MSG = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def live(serve_module: Callable[..., LiveServer]) -> LiveServer:
    return serve_module(config_with(
        models=[synth_chat(CHAT), synth_chat(BYTES, byte_tokens=True, vocab_size=300),
                synth_embed("embed")],
        server={"model_aliases": {"gpt-4o": CHAT}},
        workers={"count": 1, "budget_bytes": 1_000_000_000}))


def test_paths_without_v1_and_no_model_serve_the_default(live: LiveServer) -> None:
    body = {"messages": MSG, "max_tokens": 2}
    with live.client() as c:
        r = c.post("/chat/completions", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["model"] == CHAT
        assert r.json()["usage"]["completion_tokens"] == 2
        assert c.post("/v1/chat/completions", json=body).json()["model"] == CHAT
        # llama-server's /completions is its native completion, /v1/completions OpenAI's
        native = c.post("/completions", json={"prompt": "hello", "max_tokens": 2}).json()
        assert native["model"] == CHAT and native["tokens_predicted"] == 2
        openai = c.post("/v1/completions", json={"prompt": "hello", "max_tokens": 2}).json()
        assert openai["object"] == "text_completion" and openai["model"] == CHAT


def test_models_embeddings_and_health_without_v1(live: LiveServer) -> None:
    with live.client() as c:
        assert [m["id"] for m in c.get("/models").json()["data"]] == [CHAT, BYTES, "embed"]
        r = c.post("/embeddings", json={"model": "embed", "input": "x"})
        assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == 16
        assert c.get("/v1/health").json() == {"status": "ok"}


def test_an_alias_names_its_model_and_an_unknown_name_is_refused(live: LiveServer) -> None:
    with live.client() as c:
        r = c.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": MSG,
                                                 "max_tokens": 1})
        assert r.status_code == 200 and r.json()["model"] == CHAT
        assert_error(c.post("/v1/chat/completions", json={"model": "nope", "messages": MSG}),
                     404, code="model_not_found")


def test_an_alias_names_its_model_on_messages_and_responses(live: LiveServer) -> None:
    """Aliases are the server's, not one API's: Anthropic Messages, its count_tokens and
    OpenAI Responses resolve them as chat does (they answered 404 to an alias)."""
    with live.client() as c:
        r = c.post("/v1/messages", json={"model": "gpt-4o", "messages": MSG, "max_tokens": 1})
        assert r.status_code == 200 and r.json()["model"] == CHAT, r.text
        r = c.post("/v1/messages/count_tokens", json={"model": "gpt-4o", "messages": MSG})
        assert r.status_code == 200 and r.json()["input_tokens"] > 0, r.text
        r = c.post("/v1/responses", json={"model": "gpt-4o", "input": "hello",
                                          "max_output_tokens": 1})
        assert r.status_code == 200 and r.json()["model"] == CHAT, r.text
        r = c.post("/v1/messages", json={"model": "nope", "messages": MSG, "max_tokens": 1})
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


def test_one_model_server_can_serve_any_name(serve: Callable[..., LiveServer]) -> None:
    live = serve(config_with(models=[synth_chat(CHAT)], workers={"count": 1},
                             server={"unknown_model": "default"}))
    with live.client() as c:
        r = c.post("/v1/chat/completions", json={"model": "whatever", "messages": MSG,
                                                 "max_tokens": 1})
        assert r.status_code == 200 and r.json()["model"] == CHAT


def test_cors_is_off_unless_configured(live: LiveServer,
                                       serve: Callable[..., LiveServer]) -> None:
    preflight = {"origin": "http://example.test", "access-control-request-method": "POST"}
    with live.client() as c:
        r = c.options("/v1/chat/completions", headers=preflight)
        assert "access-control-allow-origin" not in r.headers
        r = c.get("/v1/models", headers={"origin": "http://example.test"})
        assert "access-control-allow-origin" not in r.headers
    on = serve(config_with(models=[synth_chat(CHAT)], workers={"count": 1},
                           server={"cors_origins": ["http://example.test"]}))
    with on.client() as c:
        r = c.options("/v1/chat/completions", headers=preflight)
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "http://example.test"
        r = c.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 1},
                   headers={"origin": "http://example.test"})
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "http://example.test"
        r = c.options("/v1/chat/completions", headers={**preflight,
                                                       "origin": "http://other.test"})
        assert "access-control-allow-origin" not in r.headers
    local = serve(config_with(models=[synth_chat(CHAT)], workers={"count": 1},
                              server={"cors_origins": ["localhost"]}))
    with local.client() as c:  # llama-server's keyword: any origin on the loopback
        for origin in ("http://localhost", "http://localhost:8080", "http://127.0.0.1:3000",
                       "https://[::1]:3000"):
            r = c.options("/v1/chat/completions", headers={**preflight, "origin": origin})
            assert r.headers["access-control-allow-origin"] == origin
            # in llama-server's letter case, which case-sensitive readers look for
            assert dict(r.headers.raw)[b"Access-Control-Allow-Origin"] == origin.encode()
        for origin in ("http://localhost.evil.test", "http://notlocalhost", "http://a.test"):
            r = c.options("/v1/chat/completions", headers={**preflight, "origin": origin})
            # as llama-server: 200 without CORS headers (the browser refuses the call)
            assert r.status_code == 200
            assert not any(h.startswith("access-control-") for h in r.headers)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_grammar_constrains_the_output(live: LiveServer, path: str) -> None:
    body: dict[str, object] = {"model": BYTES, "max_tokens": 20, "temperature": 0,
                               "grammar": 'root ::= "yes" | "no"'}
    with live.client() as c:
        if path == "/v1/completions":
            r = c.post(path, json={**body, "prompt": "answer"})
            text = r.json()["choices"][0]["text"]
        else:
            r = c.post("/v1/chat/completions", json={**body, "messages": MSG})
            text = r.json()["choices"][0]["message"]["content"]
        assert r.status_code == 200, r.text
        assert text in ("yes", "no")


def test_top_level_json_schema_constrains_the_output(live: LiveServer) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    with live.client() as c:
        r = c.post("/v1/chat/completions", json={"model": BYTES, "messages": MSG,
                                                 "max_tokens": 40, "json_schema": schema})
        assert r.status_code == 200, r.text
        assert isinstance(json.loads(r.json()["choices"][0]["message"]["content"])["n"], int)


@pytest.mark.parametrize(("change", "param"), [
    ({"grammar": "root ::= ("}, "grammar"),
    ({"grammar": 'start ::= "a"'}, "grammar"),  # no root rule
    ({"grammar": 'root ::= "a"', "json_schema": {"type": "object"}}, "grammar"),
    ({"json_schema": {"type": "object"}, "response_format": {"type": "json_object"}},
     "json_schema"),
])
def test_bad_or_conflicting_constraints_are_400_naming_the_field(
        live: LiveServer, change: dict[str, object], param: str) -> None:
    with live.client() as c:
        r = c.post("/v1/chat/completions", json={"model": BYTES, "messages": MSG,
                                                 "max_tokens": 4, **change})
        assert_error(r, 400, code="invalid_value", param=param)
        assert c.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 1}
                      ).status_code == 200


def test_a_model_that_failed_to_load_fails_health_and_requests_get_503(
        serve: Callable[..., LiveServer]) -> None:
    live = serve(config_with(models=[synth_chat("broken", fail_load=True)],
                             workers={"count": 1}))
    with live.client() as c:
        for path in ("/health", "/v1/health"):
            r = c.get(path)
            assert r.status_code == 503
            body = r.json()
            assert body["status"] == "failed" and "broken failed to load" in body["reason"]
            assert body["error"]["code"] == 503
        r = c.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 1})
        err = assert_error(r, 503, code="model_load_failed")
        assert err["message"] == "The model could not be loaded."
        assert r.headers["retry-after"] == "1"


def test_chat_answers_carry_llama_servers_fields_beside_openais(live: LiveServer) -> None:
    """``system_fingerprint``, ``usage.prompt_tokens_details.cached_tokens`` and
    llama-server's ``timings`` on the body and on the stream's usage chunk; a stream opens
    with the role alone (``content`` null), as OpenAI and llama-server send it."""
    with live.client() as c:
        body = c.post("/chat/completions", json={"messages": MSG, "max_tokens": 3}).json()
        assert body["system_fingerprint"].startswith("b")
        assert body["usage"]["prompt_tokens_details"]["cached_tokens"] >= 0
        assert body["timings"]["predicted_n"] == body["usage"]["completion_tokens"] == 3
        assert body["timings"]["prompt_n"] + body["timings"]["cache_n"] == (
            body["usage"]["prompt_tokens"])
        with c.stream("POST", "/chat/completions", json={
                "messages": MSG, "max_tokens": 3, "stream": True,
                "stream_options": {"include_usage": True}}) as r:
            chunks = [json.loads(line[6:]) for line in r.iter_lines()
                      if line.startswith("data: {")]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert all("role" not in ch["choices"][0]["delta"] for ch in chunks[1:] if ch["choices"])
    assert all(ch["system_fingerprint"] == body["system_fingerprint"] for ch in chunks)
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == [] and usage_chunk["timings"]["predicted_n"] == 3
    assert usage_chunk["usage"]["prompt_tokens_details"]["cached_tokens"] >= 0


def test_verbose_answers_carry_the_rendered_prompt(live: LiveServer) -> None:
    """llama-server's ``verbose``: the body's ``__verbose.prompt`` is the prompt the chat
    template rendered (what ``/apply-template`` answers); without it, no ``__verbose``."""
    with live.client() as c:
        rendered = c.post("/apply-template", json={"model": BYTES, "messages": MSG}
                          ).json()["prompt"]
        body = c.post("/chat/completions", json={"model": BYTES, "messages": MSG,
                                                 "max_tokens": 1, "verbose": True}).json()
        assert body["__verbose"]["prompt"].endswith(rendered)
        plain = c.post("/chat/completions", json={"model": BYTES, "messages": MSG,
                                                  "max_tokens": 1}).json()
        assert "__verbose" not in plain


def test_models_list_aliases_and_tags(serve: Callable[..., LiveServer]) -> None:
    """llama-server's ``/models`` entry: every name that serves the model (its id among
    them) and its ``--tags``."""
    live = serve(config_with(models=[{**synth_chat(CHAT), "tags": ["chat", "small"]},
                                     synth_chat(BYTES)],
                             workers={"count": 1}, server={"model_aliases": {"fim": CHAT}}))
    with live.client() as c:
        chat, plain = c.get("/models").json()["data"]
    assert (chat["id"], chat["aliases"], chat["tags"]) == (CHAT, ["chat", "fim"],
                                                           ["chat", "small"])
    assert (plain["aliases"], plain["tags"]) == ([BYTES], [])


@pytest.mark.parametrize(("path", "etype"), [
    ("/chat/completions", "exceed_context_size_error"),
    ("/v1/chat/completions", "invalid_request_error"),
])
def test_past_the_context_carries_llama_servers_counts(live: LiveServer, path: str,
                                                       etype: str) -> None:
    """OpenAI's error with llama-server's ``n_prompt_tokens`` and ``n_ctx`` (one sequence's
    context); at llama-server's path its error type, at ``/v1`` OpenAI's. Refused from the
    prompt's length before tokenizing (the fewest tokens it can have) and after (exact)."""
    long_chat = [{"role": "user", "content": "What is the best book " * 400}]
    with live.client() as c:
        err = assert_error(c.post(path, json={"model": BYTES, "messages": long_chat}), 400,
                           code="context_length_exceeded", type=etype, param="messages")
        assert err["n_ctx"] == 512 and err["n_prompt_tokens"] >= 512
        err = assert_error(c.post(path, json={"model": BYTES, "messages": MSG,
                                              "max_tokens": 600}), 400,
                           code="context_length_exceeded", type=etype, param="max_tokens")
        served = c.post(path, json={"model": BYTES, "messages": MSG, "max_tokens": 1}).json()
        assert (err["n_prompt_tokens"], err["n_ctx"]) == (served["usage"]["prompt_tokens"], 512)
