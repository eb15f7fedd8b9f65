"""The drop-in surface that does not depend on what a model generates, driven by the real
``openai`` SDK, LangChain's ``ChatOpenAI`` and plain HTTP against a synthetic server:
unknown fields tolerated, content parts, tool turns in the history, tools offered,
``GET /v1/models/{id}``, ``/tokenize``, ``/detokenize`` and ``/version``."""

from __future__ import annotations

from collections.abc import Iterator
from importlib import metadata

import httpx
import openai
import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from sluice.backends.chat import chat_tokens
from sluice.backends.synthetic import SyntheticTokenizer
from tests.server.live import LiveServer, assert_error

CHAT = "synth-chat"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "22C"},
]


@pytest.fixture(scope="module")
def oai(synthetic_server: LiveServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{synthetic_server.url}/v1", api_key="unused",
                       max_retries=0, timeout=30.0) as client:
        yield client


@pytest.fixture(scope="module")
def tok(synthetic_server: LiveServer) -> SyntheticTokenizer:
    spec = next(m for m in synthetic_server.config.models if m.id == CHAT).spec()
    return SyntheticTokenizer(spec)


@pytest.fixture(scope="module")
def lc(synthetic_server: LiveServer) -> ChatOpenAI:
    return ChatOpenAI(model=CHAT, base_url=f"{synthetic_server.url}/v1", api_key="unused",
                      temperature=0, max_tokens=4, max_retries=0, timeout=30)


def test_unknown_fields_are_ignored_and_named(oai: openai.OpenAI) -> None:
    raw = oai.chat.completions.with_raw_response.create(
        model=CHAT, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
        extra_body={"frobnicate": 1, "cache_prompt": True}, store=True,
        metadata={"k": "v"})
    ignored = raw.headers["x-sluice-ignored-fields"].split(",")
    assert sorted(ignored) == ["cache_prompt", "frobnicate", "metadata", "store"]
    assert raw.parse().choices[0].finish_reason == "length"


def test_content_as_text_parts_user_and_max_completion_tokens(
    oai: openai.OpenAI, tok: SyntheticTokenizer
) -> None:
    parts = oai.chat.completions.create(
        model=CHAT, temperature=0, max_completion_tokens=3, user="alice",
        messages=[{"role": "user", "content": [{"type": "text", "text": "tell me "},
                                               {"type": "text", "text": "more"}]}])
    plain = oai.chat.completions.create(
        model=CHAT, temperature=0, max_completion_tokens=3,
        messages=[{"role": "user", "content": "tell me more"}])
    assert parts.choices[0].message.content == plain.choices[0].message.content
    assert parts.usage is not None and parts.usage.completion_tokens == 3


def test_tool_turns_in_the_history_render_in_the_generic_format(
    oai: openai.OpenAI, tok: SyntheticTokenizer
) -> None:
    resp = oai.chat.completions.create(model=CHAT, messages=HISTORY,  # type: ignore[arg-type]
                                       tools=TOOLS, max_tokens=2)  # type: ignore[arg-type]
    expected = chat_tokens(tok, tok.apply_chat(HISTORY, TOOLS))
    assert resp.usage is not None and resp.usage.prompt_tokens == len(expected)
    without_tools = oai.chat.completions.create(
        model=CHAT, messages=HISTORY, max_tokens=2)  # type: ignore[arg-type]
    assert without_tools.usage is not None
    assert without_tools.usage.prompt_tokens == len(chat_tokens(tok, tok.apply_chat(HISTORY)))
    assert without_tools.usage.prompt_tokens < resp.usage.prompt_tokens
    # tool_choice "none": the tools are not offered at all.
    none = oai.chat.completions.create(model=CHAT, messages=HISTORY,  # type: ignore[arg-type]
                                       tools=TOOLS, tool_choice="none",  # type: ignore[arg-type]
                                       max_tokens=2)
    assert none.usage is not None
    assert none.usage.prompt_tokens == without_tools.usage.prompt_tokens


def test_text_that_is_no_call_stays_content_streamed_or_not(oai: openai.OpenAI) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    resp = oai.chat.completions.create(model=CHAT, messages=msgs,  # type: ignore[arg-type]
                                       tools=TOOLS, max_tokens=3,  # type: ignore[arg-type]
                                       temperature=0)
    choice = resp.choices[0]
    assert choice.finish_reason == "length" and choice.message.tool_calls is None
    pieces = []
    with oai.chat.completions.create(model=CHAT, messages=msgs,  # type: ignore[call-overload]
                                     tools=TOOLS, max_tokens=3, temperature=0,
                                     stream=True) as stream:
        for chunk in stream:
            for c in chunk.choices:
                pieces.append(c.delta.content or "")
    assert "".join(pieces) == choice.message.content


def test_langchain_chat_with_tools_bound_and_tool_history(lc: ChatOpenAI) -> None:
    @tool
    def get_weather(city: str) -> str:
        """Weather in a city."""
        return "22C"

    bound = lc.bind_tools([get_weather])
    reply = bound.invoke([
        SystemMessage("Be brief."),
        HumanMessage("Weather in Paris?"),
        AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": "Paris"},
                                   "id": "call_1"}]),
        ToolMessage("22C", tool_call_id="call_1"),
    ])
    assert isinstance(reply, AIMessage)
    assert reply.tool_calls == []  # the synthetic model writes no JSON
    assert reply.response_metadata["finish_reason"] == "length"
    streamed = "".join(str(c.content) for c in lc.stream("hello"))
    assert streamed == lc.invoke("hello").content


def test_get_model_by_id(oai: openai.OpenAI) -> None:
    model = oai.models.retrieve(CHAT)
    assert model.id == CHAT and model.object == "model"
    assert model.model_extra is not None and model.model_extra["kind"] == "generative"
    assert [m.id for m in oai.models.list()].count(CHAT) == 1
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("no-such-model")


def test_get_unknown_model_is_the_openai_404(client: httpx.Client) -> None:
    assert_error(client.get("/v1/models/nope"), 404, code="model_not_found", param="model")


def test_tokenize_and_detokenize_in_llama_servers_shape(client: httpx.Client,
                                                        tok: SyntheticTokenizer) -> None:
    r = client.post("/tokenize", json={"content": "hello world"})
    assert r.status_code == 200
    ids = tok.tokenize("hello world", add_bos=False)
    assert r.json() == {"tokens": ids}
    bos = client.post("/tokenize", json={"content": "hello world", "add_special": True})
    assert bos.json()["tokens"] == tok.tokenize("hello world", add_bos=True)
    pieces = client.post("/tokenize", json={"content": "w5 w6", "with_pieces": True}).json()
    assert pieces == {"tokens": [{"id": 5, "piece": " w5"}, {"id": 6, "piece": " w6"}]}
    d = client.post("/detokenize", json={"tokens": [5, 6]})
    assert d.json() == {"content": " w5 w6", "prompt": " w5 w6"}


def test_tokenize_in_vllms_shape_text_and_chat(client: httpx.Client,
                                               tok: SyntheticTokenizer) -> None:
    r = client.post("/tokenize", json={"model": CHAT, "prompt": "w7 w8",
                                       "return_token_strs": True}).json()
    assert r == {"count": 3, "max_model_len": tok.n_ctx_per_seq, "tokens": [1, 7, 8],
                 "token_strs": ["", " w7", " w8"]}
    chat = client.post("/tokenize", json={"model": CHAT, "messages": HISTORY,
                                          "tools": TOOLS}).json()
    full = chat_tokens(tok, tok.apply_chat(HISTORY, TOOLS))
    assert chat["tokens"] == full[1:]  # vLLM adds no special tokens to chat by default
    assert chat["count"] == len(full) - 1
    assert client.post("/detokenize", json={"model": CHAT, "tokens": [7]}).json()["prompt"] \
        == " w7"


def test_tokenizer_endpoint_errors(client: httpx.Client) -> None:
    assert_error(client.post("/tokenize", json={"content": "a", "prompt": "b"}), 400)
    assert_error(client.post("/tokenize", json={"model": "nope", "content": "a"}), 404,
                 code="model_not_found")
    assert_error(client.post("/tokenize", json={"model": "synth-a", "content": "a"}), 400,
                 code="model_kind_mismatch")
    assert_error(client.post("/detokenize", json={"tokens": [10_000]}), 400, param="tokens")
    assert client.post("/tokenize", json={"content": "still serving"}).status_code == 200


def test_version(client: httpx.Client) -> None:
    body = client.get("/version").json()
    assert body["version"] == metadata.version("sluice")
    assert body["llama_cpp_python"] == metadata.version("llama-cpp-python")


def test_any_integer_is_a_seed(oai: openai.OpenAI, client: httpx.Client) -> None:
    for seed in (-1, 2**64, -(2**200), 0):
        r = oai.completions.create(model=CHAT, prompt="a b", max_tokens=3, seed=seed)
        assert r.choices[0].finish_reason == "length"
    same = [oai.completions.create(model=CHAT, prompt="a b", max_tokens=3, seed=-5,
                                   temperature=1).choices[0].text for _ in range(2)]
    assert same[0] == same[1]
    assert client.post("/v1/infer", json={"model": CHAT, "input": "x", "seed": -3,
                                          "max_new_tokens": 2}).status_code == 200
