"""What a drop-in OpenAI server must do with a real model, driven by the official ``openai``
SDK and LangChain against the packaged Gemma 3 270M: logprobs (chat and legacy, streamed
and not, echo with the prompt's), ``n`` choices from one prefill, seeds, penalties,
``logit_bias``, ``min_p``, structured output that parses and validates against its schema,
and tool calls that parse (required or named: constrained to the call's schema).

These need the engine side of issue 12 (sampler, logprobs, n, constrained decoding)."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterator
from typing import Any, Literal

import jsonschema
import openai
import pytest
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

from tests.llm.test_llm_server import MODEL, config
from tests.server.live import LiveServer, start_server

pytestmark = pytest.mark.llm
pytest.importorskip("llama_cpp", reason="the llm extra is not installed")

CHAT: Any = [{"role": "user", "content": "Name three colours."}]
PROMPT = "The capital of France is the city of"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Get the time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string",
                                                               "maxLength": 20}},
                   "required": ["zone"]}}}


class Verdict(BaseModel):
    answer: Literal["yes", "no"]
    confidence: int = Field(ge=0, le=100)
    reason: str = Field(max_length=40)


@pytest.fixture(scope="module")
def live() -> Iterator[LiveServer]:
    server = start_server(config())
    yield server
    server.stop()


@pytest.fixture(scope="module")
def oai(live: LiveServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0,
                       timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def lc(live: LiveServer) -> ChatOpenAI:
    return ChatOpenAI(model=MODEL, base_url=f"{live.url}/v1", api_key="unused",
                      temperature=0, max_tokens=80, max_retries=0, timeout=120)


# -- logprobs -----------------------------------------------------------------------------


def test_chat_logprobs_are_the_greedy_tokens_own(oai: openai.OpenAI) -> None:
    r = oai.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=6, temperature=0,
                                    logprobs=True, top_logprobs=3)
    choice = r.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    content = choice.logprobs.content
    assert len(content) == r.usage.completion_tokens  # type: ignore[union-attr]
    assert "".join(e.token for e in content) == choice.message.content
    for entry in content:
        assert entry.logprob <= 0 and entry.bytes == list(entry.token.encode())
        tops = entry.top_logprobs
        assert len(tops) == 3
        assert [t.logprob for t in tops] == sorted((t.logprob for t in tops), reverse=True)
        assert tops[0].token == entry.token  # greedy picks the most likely
        assert math.isclose(tops[0].logprob, entry.logprob, abs_tol=1e-6)
        assert sum(math.exp(t.logprob) for t in tops) <= 1.0 + 1e-6


def test_streamed_chat_logprobs_match_the_whole_answer(oai: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"model": MODEL, "messages": CHAT, "max_tokens": 6,
                              "temperature": 0, "logprobs": True, "top_logprobs": 2}
    whole = oai.chat.completions.create(**kwargs).choices[0].logprobs
    assert whole is not None and whole.content is not None
    streamed = []
    for chunk in oai.chat.completions.create(**kwargs, stream=True):
        for c in chunk.choices:
            if c.logprobs and c.logprobs.content:
                streamed.extend(c.logprobs.content)
    assert [e.token for e in streamed] == [e.token for e in whole.content]
    for a, b in zip(streamed, whole.content, strict=True):
        assert math.isclose(a.logprob, b.logprob, abs_tol=1e-3)


def test_completion_logprobs_legacy_shape(oai: openai.OpenAI) -> None:
    r = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0,
                               logprobs=2)
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs
    assert "".join(lp.tokens) == r.choices[0].text
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(4)]
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs,
                                   strict=True):
        assert token in top and math.isclose(top[token], logprob, abs_tol=1e-6)
        assert 1 <= len(top) <= 3  # two alternatives plus the sampled token
    streamed = [c.choices[0].logprobs for c in oai.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=2, stream=True)
        if c.choices and c.choices[0].logprobs]
    tokens = [t for s in streamed for t in (s.tokens or [])]  # type: ignore[union-attr]
    assert tokens == lp.tokens


def test_echo_gives_the_prompts_logprobs_for_log_likelihood(oai: openai.OpenAI,
                                                            live: LiveServer) -> None:
    """An evaluation harness scores a continuation by the logprobs of the echoed prompt;
    the last prompt token's logprob is what sampling reported for it as a generated one."""
    first = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, temperature=0,
                                   logprobs=0)
    lp = first.choices[0].logprobs
    assert lp is not None and lp.token_logprobs is not None
    word, generated = first.choices[0].text, lp.token_logprobs[0]
    echoed = oai.completions.create(model=MODEL, prompt=PROMPT + word, max_tokens=1,
                                    temperature=0, logprobs=1, echo=True)
    choice = echoed.choices[0]
    assert choice.text.startswith(PROMPT + word)
    elp = choice.logprobs
    assert elp is not None and elp.token_logprobs is not None and elp.tokens is not None
    n_prompt = len(live.runtime.tokenizer(MODEL).tokenize(PROMPT + word, add_bos=True))
    assert echoed.usage is not None and echoed.usage.prompt_tokens == n_prompt
    assert len(elp.tokens) == n_prompt + 1
    assert elp.token_logprobs[0] is None
    assert all(x is not None and x <= 0 for x in elp.token_logprobs[1:])
    assert math.isclose(elp.token_logprobs[n_prompt - 1], generated, abs_tol=1e-2)


# -- n, seed, penalties, bias, min_p -----------------------------------------------------


def test_n_choices_share_one_prompt(oai: openai.OpenAI) -> None:
    one = oai.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5, seed=3)
    two = oai.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5, n=2, seed=3)
    assert [c.index for c in two.choices] == [0, 1]
    assert two.usage is not None and one.usage is not None
    assert two.usage.prompt_tokens == one.usage.prompt_tokens  # the prompt counts once
    assert two.usage.completion_tokens == 10
    chunks = list(oai.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5, n=2,
                                              seed=3, stream=True))
    by_index: dict[int, str] = {0: "", 1: ""}
    finished = set()
    for chunk in chunks:
        for c in chunk.choices:
            by_index[c.index] += c.delta.content or ""
            if c.finish_reason:
                finished.add(c.index)
    assert finished == {0, 1}
    assert by_index == {c.index: c.message.content for c in two.choices}


def test_the_same_seed_gives_the_same_text(oai: openai.OpenAI) -> None:
    def sample(seed: int) -> str:
        return oai.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12,
                                      temperature=1.0, seed=seed).choices[0].text

    assert sample(2**70) == sample(2**70)
    assert sample(-1) == sample(-1)
    texts = {sample(s) for s in (1, 2, 3)}
    assert len(texts) > 1


def test_min_p_one_keeps_only_the_most_likely_token(oai: openai.OpenAI) -> None:
    greedy = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    sampled = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=1.5,
                                     extra_body={"min_p": 1.0}, seed=7)
    assert sampled.choices[0].text == greedy.choices[0].text


def test_logit_bias_bans_a_token(oai: openai.OpenAI, live: LiveServer) -> None:
    greedy = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, temperature=0,
                                    logprobs=0)
    word = greedy.choices[0].text
    [banned] = live.runtime.tokenizer(MODEL).tokenize(word, add_bos=False)
    biased = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, temperature=0,
                                    logit_bias={str(banned): -100})
    assert biased.choices[0].text != word


def test_penalties_curb_repetition(oai: openai.OpenAI, live: LiveServer) -> None:
    tok = live.runtime.tokenizer(MODEL)
    prompt = "one one one one one one one one one one"

    def most_repeated(**kwargs: Any) -> tuple[str, int]:
        text = oai.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0,
                                      **kwargs).choices[0].text
        return text, max(Counter(tok.tokenize(text, add_bos=False)).values())

    plain, plain_max = most_repeated()
    for kwargs in ({"frequency_penalty": 2.0}, {"extra_body": {"repetition_penalty": 1.8}},
                   {"extra_body": {"repeat_penalty": 1.8, "repeat_last_n": -1}}):
        text, n = most_repeated(**kwargs)
        assert text != plain, kwargs
        assert n <= plain_max, kwargs


PRESENCE_PROMPTS = ("The cat sat on the mat. The dog sat on the", "I like red and blue and",
                    "Monday, Tuesday, Monday, Tuesday,", "a b a b a b a b")


def test_presence_penalty_turns_a_close_repeat_away(oai: openai.OpenAI,
                                                    live: LiveServer) -> None:
    """Greedy output, with the raw logprobs of the top two tokens at each step: at the first
    step whose choice repeats an earlier generated token while the runner-up, never seen,
    trails by less than 2, a presence penalty of 2 must change the text (there or before)."""
    tok = live.runtime.tokenizer(MODEL)
    checked = 0
    for prompt in PRESENCE_PROMPTS:
        r = oai.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0,
                                   logprobs=2)
        lp = r.choices[0].logprobs
        assert lp is not None and lp.tokens and lp.top_logprobs and lp.token_logprobs
        seen_prompt = set(tok.tokenize(prompt, add_bos=False))
        seen: set[str] = set()
        for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs,
                                       strict=True):
            others = {t: v for t, v in top.items() if t != token}
            if token in seen and others:
                runner, value = max(others.items(), key=lambda kv: kv[1])
                fresh = runner not in seen and not (
                    set(tok.tokenize(runner, add_bos=False)) & seen_prompt)
                if fresh and logprob - value < 2.0:
                    penalised = oai.completions.create(
                        model=MODEL, prompt=prompt, max_tokens=16, temperature=0,
                        presence_penalty=2.0).choices[0].text
                    assert penalised != r.choices[0].text, prompt
                    checked += 1
                    break
            seen.add(token)
    assert checked, "no prompt had a close repeat to test"


# -- structured output --------------------------------------------------------------------


def test_json_object_parses(oai: openai.OpenAI) -> None:
    r = oai.chat.completions.create(model=MODEL, messages=[
        {"role": "user", "content": "Describe a cat as JSON."}], max_tokens=60,
        response_format={"type": "json_object"}, temperature=0)
    assert isinstance(json.loads(r.choices[0].message.content or ""), dict)


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_answers_validate(oai: openai.OpenAI, stream: bool) -> None:
    schema = Verdict.model_json_schema()
    kwargs: dict[str, Any] = {
        "model": MODEL, "max_tokens": 120, "temperature": 0,
        "messages": [{"role": "user", "content": "Is the sky blue? Answer in JSON."}],
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "verdict", "schema": schema, "strict": True}}}
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in
                       oai.chat.completions.create(**kwargs, stream=True) if c.choices)
    else:
        text = oai.chat.completions.create(**kwargs).choices[0].message.content or ""
    jsonschema.validate(json.loads(text), schema)
    Verdict.model_validate_json(text)


def test_openai_sdk_parse_with_a_pydantic_model(oai: openai.OpenAI) -> None:
    r = oai.chat.completions.parse(model=MODEL, messages=[
        {"role": "user", "content": "Is water wet?"}], response_format=Verdict,
        max_tokens=120, temperature=0.7, seed=5)
    assert isinstance(r.choices[0].message.parsed, Verdict)


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_with_structured_output(lc: ChatOpenAI, method: str) -> None:
    structured = lc.with_structured_output(Verdict, method=method)  # type: ignore[arg-type]
    result = structured.invoke("Is fire hot? Reply in JSON with answer, confidence and reason.")
    assert isinstance(result, Verdict)


def test_langchain_json_mode_gives_a_json_object(lc: ChatOpenAI) -> None:
    """json_mode asks for any JSON object (no schema, as with OpenAI): the raw answer
    parses; whether it fits the model is up to the prompt."""
    structured = lc.with_structured_output(Verdict, method="json_mode", include_raw=True)
    result = structured.invoke("Is fire hot? Reply in JSON.")
    assert isinstance(result, dict)
    assert isinstance(json.loads(str(result["raw"].content)), dict)


def test_a_schema_the_engine_cannot_compile_is_a_400(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5,
                                    response_format={"type": "json_schema", "json_schema": {
                                        "name": "bad", "schema": {"type": "no-such-type"}}})
    assert caught.value.body["param"] == "response_format"  # type: ignore[index]
    ok = oai.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2)
    assert ok.choices[0].finish_reason == "length"


# -- tools --------------------------------------------------------------------------------


def _check_call(call: Any, tools: list[dict[str, Any]]) -> dict[str, Any]:
    fn = {t["function"]["name"]: t["function"] for t in tools}[call.function.name]
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, fn["parameters"])
    return dict(args)


@pytest.mark.parametrize("stream", [False, True])
def test_required_tool_call_parses(oai: openai.OpenAI, stream: bool) -> None:
    kwargs: dict[str, Any] = {
        "model": MODEL, "max_tokens": 80, "temperature": 0, "tools": [WEATHER, TIME],
        "tool_choice": "required",
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}]}
    if not stream:
        choice = oai.chat.completions.create(**kwargs).choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.tool_calls
        for call in choice.message.tool_calls:
            _check_call(call, [WEATHER, TIME])
        return
    calls: dict[int, dict[str, str]] = {}
    reasons = []
    for chunk in oai.chat.completions.create(**kwargs, stream=True):
        for c in chunk.choices:
            for d in c.delta.tool_calls or []:
                entry = calls.setdefault(d.index, {"name": "", "arguments": ""})
                entry["name"] += (d.function.name or "") if d.function else ""
                entry["arguments"] += (d.function.arguments or "") if d.function else ""
            if c.finish_reason:
                reasons.append(c.finish_reason)
    assert reasons == ["tool_calls"] and calls
    for entry in calls.values():
        fn = {t["function"]["name"]: t for t in (WEATHER, TIME)}[entry["name"]]["function"]
        jsonschema.validate(json.loads(entry["arguments"]), fn["parameters"])


def test_named_tool_call_and_the_conversation_after_it(oai: openai.OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "What time is it in Tokyo?"}]
    r = oai.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=60, temperature=0, tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}})
    [call] = r.choices[0].message.tool_calls or []
    assert call.function.name == "get_time"
    _check_call(call, [TIME])
    messages += [r.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "09:00"}]
    after = oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=10,
                                        temperature=0, tools=[WEATHER, TIME])
    assert after.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_langchain_bind_tools_with_a_required_call(lc: ChatOpenAI) -> None:
    @tool
    def get_weather(city: str) -> str:
        """Get the weather in a city."""
        return "22C"

    reply = lc.bind_tools([get_weather], tool_choice="get_weather").invoke(
        "What is the weather in Paris?")
    assert isinstance(reply, AIMessage)
    [call] = reply.tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"].get("city"), str)
