"""Ollama's API with the real ``ollama`` Python client against a real uvicorn server on the
synthetic backend: chat (whole and streamed), generate, list, show, ps, embed; keep_alive
driving the model lifecycle; errors in Ollama's shape; model management answering 501."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator

import httpx
import ollama
import pytest

from tests.server.live import LiveServer, config_with, synth_chat, synth_embed, wait_for

CHAT, EMBED, BYTES = "chat", "embed", "bytes"
"""A word-vocabulary chat model, an embedding model, and a chat model whose vocabulary is
the 256 bytes (so constrained decoding can spell JSON)."""
ALIAS, EMBED_ALIAS = "talk", "vectors"
"""More names of CHAT and EMBED (``server.model_aliases``, as ``--alias`` gives)."""


@pytest.fixture(scope="module")
def live(serve_module: Callable[..., LiveServer]) -> LiveServer:
    return serve_module(config_with(
        models=[synth_chat(CHAT), synth_embed(EMBED),
                synth_chat(BYTES, byte_tokens=True, vocab_size=300)],
        workers={"count": 1, "budget_bytes": 1_000_000_000},
        server={"model_aliases": {ALIAS: CHAT, EMBED_ALIAS: EMBED}}))


@pytest.fixture
def client(live: LiveServer) -> Iterator[ollama.Client]:
    with ollama.Client(host=live.url, timeout=30) as c:
        yield c


def test_chat_answers_with_the_message_and_counts(client: ollama.Client) -> None:
    r = client.chat(model=CHAT, messages=[{"role": "user", "content": "hello"}],
                    options={"num_predict": 5, "temperature": 0})
    assert r.done and r.done_reason == "length"
    assert r.message.role == "assistant" and r.message.content
    assert r.eval_count == 5 and r.prompt_eval_count and r.prompt_eval_count > 0
    assert r.total_duration and r.total_duration > 0


def test_chat_streams_pieces_then_the_done_object(client: ollama.Client) -> None:
    parts = list(client.chat(model=CHAT, messages=[{"role": "user", "content": "hello"}],
                             options={"num_predict": 6, "temperature": 0}, stream=True))
    assert len(parts) == 7 and all(not p.done for p in parts[:-1])
    assert parts[-1].done and parts[-1].eval_count == 6 and parts[-1].message.content == ""
    whole = client.chat(model=CHAT, messages=[{"role": "user", "content": "hello"}],
                        options={"num_predict": 6, "temperature": 0})
    assert "".join(p.message.content for p in parts) == whole.message.content


def test_generate_with_and_without_the_template(client: ollama.Client) -> None:
    r = client.generate(model=CHAT, prompt="once upon", options={"num_predict": 4, "seed": 7})
    assert r.done and r.response and r.eval_count == 4
    raw = client.generate(model=CHAT, prompt="once upon", raw=True,
                          options={"num_predict": 4})
    assert raw.prompt_eval_count is not None and r.prompt_eval_count is not None
    assert raw.prompt_eval_count < r.prompt_eval_count  # no chat turn around it
    pieces = list(client.generate(model=CHAT, prompt="once upon", stream=True,
                                  options={"num_predict": 4, "seed": 7}))
    assert "".join(p.response for p in pieces) == r.response


def test_list_show_and_ps(client: ollama.Client) -> None:
    names = [m.model for m in client.list().models]
    assert names == [CHAT, EMBED, BYTES]
    shown = client.show(CHAT)
    assert shown.capabilities is not None and "completion" in shown.capabilities
    assert shown.modelinfo is not None and shown.modelinfo["synthetic.context_length"] == 512
    client.chat(model=CHAT, messages=[{"role": "user", "content": "x"}],
                options={"num_predict": 1})
    running = {m.model: m for m in client.ps().models}
    assert CHAT in running and running[CHAT].size == 100_000_000
    assert running[CHAT].expires_at is not None
    with pytest.raises(ollama.ResponseError) as err:
        client.show("missing")
    assert err.value.status_code == 404 and "missing" in err.value.error


def test_embed_and_the_older_embeddings(client: ollama.Client) -> None:
    r = client.embed(model=EMBED, input=["one", "two words"])
    assert len(r.embeddings) == 2 and len(r.embeddings[0]) == 16
    assert r.prompt_eval_count == 2 + 3  # each input's BOS and words, as the model read them
    assert r.embeddings[0] != r.embeddings[1]
    old = client.embeddings(model=EMBED, prompt="one")
    assert list(old.embedding) == pytest.approx(r.embeddings[0])
    with pytest.raises(ollama.ResponseError) as err:
        client.embed(model=CHAT, input="x")
    assert err.value.status_code == 400 and "does not support embeddings" in err.value.error


def test_keep_alive_zero_unloads_after_the_request_and_an_empty_chat_loads(
        client: ollama.Client, live: LiveServer) -> None:
    def loaded() -> set[str]:
        return {m.model for m in client.ps().models}

    client.chat(model=CHAT, messages=[{"role": "user", "content": "x"}],
                options={"num_predict": 1}, keep_alive=0)
    wait_for(lambda: CHAT not in loaded())
    r = client.chat(model=CHAT, messages=[])  # load only
    assert r.done_reason == "load" and CHAT in loaded()
    r = client.chat(model=CHAT, messages=[], keep_alive=0)
    assert r.done_reason == "unload" and CHAT not in loaded()
    client.chat(model=CHAT, messages=[{"role": "user", "content": "x"}],
                options={"num_predict": 1}, keep_alive="10m")
    [entry] = [m for m in client.ps().models if m.model == CHAT]
    assert entry.expires_at is not None
    left_s = entry.expires_at.timestamp() - time.time()
    assert 590 < left_s <= 600
    client.chat(model=CHAT, messages=[{"role": "user", "content": "x"}],
                options={"num_predict": 1}, keep_alive=-1)
    [entry] = [m for m in client.ps().models if m.model == CHAT]
    assert entry.expires_at is not None and entry.expires_at.year == 2318
    with live.client() as c:
        [model] = [m for m in c.get("/v1/models").json()["data"] if m["id"] == CHAT]
    assert model["state"] == "loaded" and model["keep_alive"] == "pinned"
    assert model["expires_at"] is None
    client.chat(model=CHAT, messages=[{"role": "user", "content": "x"}],
                options={"num_predict": 1})  # back to the configured keep-alive


def test_format_json_constrains_the_output(client: ollama.Client) -> None:
    r = client.generate(model=BYTES, prompt="give me json", format="json",
                        options={"num_predict": 40, "temperature": 0})
    assert isinstance(json.loads(r.response), dict)  # its free text is seldom JSON
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    r = client.chat(model=BYTES, messages=[{"role": "user", "content": "n?"}], format=schema,
                    options={"num_predict": 40, "temperature": 0})
    assert isinstance(json.loads(r.message.content)["n"], int)


def test_text_model_refuses_images_and_thinking(client: ollama.Client,
                                                live: LiveServer) -> None:
    with pytest.raises(ollama.ResponseError) as err:
        client.chat(model=CHAT, messages=[{"role": "user", "content": "x",
                                           "images": ["aGVsbG8="]}])
    assert err.value.status_code == 400 and "does not take images" in err.value.error
    with pytest.raises(ollama.ResponseError) as err:
        client.chat(model=CHAT, messages=[{"role": "user", "content": "x"}], think=True)
    assert err.value.status_code == 400 and "thinking" in err.value.error
    with live.client() as c:  # still serving
        assert c.post("/api/chat", json={"model": CHAT, "stream": False, "options": {
            "num_predict": 1}, "messages": [{"role": "user", "content": "x"}]}
        ).status_code == 200


@pytest.mark.parametrize(("body", "status", "words"), [
    ({"model": "nope", "messages": [{"role": "user", "content": "x"}]}, 404, "nope"),
    ({"model": CHAT, "messages": [{"role": "robot", "content": "x"}]}, 400, "messages.0.role"),
    ({"model": CHAT, "messages": [{"role": "user", "content": "x"}],
      "options": {"temperature": 9}}, 400, "options.temperature"),
    ({"model": CHAT, "messages": [{"role": "user", "content": "x"}], "keep_alive": "5x"},
     400, "keep_alive"),
    ({"model": CHAT, "messages": [{"role": "user", "content": "x"}],
      "options": {"num_ctx": 2}}, 400, "context asked for holds 2 tokens"),
])
def test_bad_chat_bodies_get_ollama_errors(live: LiveServer, body: dict[str, object],
                                           status: int, words: str) -> None:
    with live.client() as c:
        r = c.post("/api/chat", json=body)
        assert r.status_code == status
        assert set(r.json()) == {"error"} and words in r.json()["error"]
        r = c.post("/api/chat", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 400 and "JSON" in r.json()["error"]
        ok = c.post("/api/generate", json={"model": CHAT, "prompt": "x", "stream": False,
                                           "options": {"num_predict": 2}})
        assert ok.status_code == 200 and ok.json()["done"] is True


@pytest.mark.parametrize("action", ["pull", "create", "delete", "copy", "push"])
def test_model_management_answers_501_naming_the_sluice_way(live: LiveServer,
                                                            action: str) -> None:
    method = "DELETE" if action == "delete" else "POST"
    r = httpx.request(method, f"{live.url}/api/{action}", json={"model": "x"})
    assert r.status_code == 501 and "sluice serve FILE.gguf" in r.json()["error"]


def test_version(live: LiveServer) -> None:
    r = httpx.get(f"{live.url}/api/version")
    assert r.status_code == 200 and r.json()["version"]


def test_tools_come_back_as_tool_calls(client: ollama.Client) -> None:
    """A forced JSON output shaped like a call (the synthetic model cannot choose one by
    itself): the answer's text parses as a call to the declared tool."""
    tool = {"type": "function", "function": {
        "name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}},
            "required": ["city"]}}}
    schema = {"type": "object", "properties": {
        "name": {"const": "get_weather"},
        "arguments": {"type": "object", "properties": {"city": {"type": "string",
                                                                "maxLength": 8}},
                      "required": ["city"]}}, "required": ["name", "arguments"]}
    r = client.chat(model=BYTES, messages=[{"role": "user", "content": "weather?"}],
                    tools=[tool], format=schema, options={"num_predict": 60, "temperature": 0})
    assert r.message.tool_calls is not None
    [call] = r.message.tool_calls
    assert call.function.name == "get_weather"
    assert isinstance(call.function.arguments["city"], str)
    follow = client.chat(model=CHAT, options={"num_predict": 2}, messages=[
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "content": "sunny", "tool_name": "get_weather"}])
    assert follow.done


@pytest.mark.parametrize("name", [f"{CHAT}:latest", ALIAS, f"{ALIAS}:latest"])
def test_aliases_and_the_latest_tag_name_the_model_as_on_the_openai_routes(
        client: ollama.Client, live: LiveServer, name: str) -> None:
    """Ollama's clients send ``name:latest``; an alias is one name on every API."""
    options = {"num_predict": 3, "temperature": 0}
    want = client.chat(model=CHAT, messages=[{"role": "user", "content": "hi"}],
                       options=options).message.content
    r = client.chat(model=name, messages=[{"role": "user", "content": "hi"}], options=options)
    assert r.model == name and r.message.content == want and r.eval_count == 3
    streamed = list(client.chat(model=name, messages=[{"role": "user", "content": "hi"}],
                                options=options, stream=True))
    assert "".join(p.message.content for p in streamed) == want
    said = client.generate(model=name, prompt="hi", options=options)
    assert said.response == client.generate(model=CHAT, prompt="hi", options=options).response
    assert client.chat(model=name, messages=[]).done_reason == "load"
    shown = client.show(name)
    assert shown.modelinfo is not None and shown.modelinfo["synthetic.context_length"] == 512
    with live.client() as c:
        r2 = c.post("/v1/chat/completions", json={
            "model": name, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 3, "temperature": 0})
        assert r2.status_code == 200 and r2.json()["choices"][0]["message"]["content"] == want


@pytest.mark.parametrize("name", [f"{EMBED}:latest", EMBED_ALIAS, f"{EMBED_ALIAS}:latest"])
def test_embed_takes_aliases_and_the_latest_tag(client: ollama.Client, name: str) -> None:
    want = client.embed(model=EMBED, input="one").embeddings
    assert client.embed(model=name, input="one").embeddings == want
    assert list(client.embeddings(model=name, prompt="one").embedding) == pytest.approx(want[0])


@pytest.mark.parametrize("name", [f"{CHAT}:7b", f"{ALIAS}:7b", "nope:latest"])
def test_another_tag_is_another_name(client: ollama.Client, name: str) -> None:
    for call in (lambda: client.chat(model=name, messages=[{"role": "user", "content": "x"}]),
                 lambda: client.show(name)):
        with pytest.raises(ollama.ResponseError) as err:
            call()
        assert err.value.status_code == 404 and name in err.value.error


def test_show_without_a_model_is_400(live: LiveServer) -> None:
    with live.client() as c:
        r = c.post("/api/show", json={})
        assert r.status_code == 400 and r.json() == {"error": "model is required"}
