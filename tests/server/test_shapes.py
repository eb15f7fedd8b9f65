"""Response shapes from engine events, without a server: choices, logprobs in the chat and
legacy shapes, echo, and tool calls held back in a stream until they parse."""

from __future__ import annotations

import json
import math
from typing import Any

from sluice.backends.base import ModelSpec
from sluice.backends.synthetic import SyntheticTokenizer
from sluice.engine.request import (
    ChoiceFinal,
    Final,
    RequestStatus,
    TokenEvent,
    TokenLogprob,
)
from sluice.server.shapes.base import LOGPROB_FLOOR, TokenText
from sluice.server.shapes.chat import ChatShape
from sluice.server.shapes.completion import CompletionShape

TOK = SyntheticTokenizer(ModelSpec("s", "generative", "synthetic", 1))
TEXT = TokenText(TOK)


def ev(i: int, token: int, text: str, choice: int = 0, lp: float | None = -0.5,
       top: tuple[TokenLogprob, ...] = ()) -> TokenEvent:
    return TokenEvent(index=i, token_id=token, text=text, time_s=0.0, choice=choice,
                      logprob=lp, top_logprobs=top)


def final(text: str = "", *, choices: tuple[ChoiceFinal, ...] = (), prompt: int = 3,
          completion: int = 2, **kw: Any) -> Final:
    return Final(RequestStatus.COMPLETED, "length", text=text, prompt_tokens=prompt,
                 completion_tokens=completion, choices=choices, **kw)


def test_chat_logprobs_content_entries() -> None:
    shape = ChatShape("chatcmpl-1", "m", tokens=TEXT)
    top = (TokenLogprob(10, -0.1), TokenLogprob(11, -2.0))
    events = [ev(0, 10, " w10", lp=-0.1, top=top), ev(1, 12, " w12", lp=-math.inf)]
    body = shape.full(final(" w10 w12"), events)
    content = body["choices"][0]["logprobs"]["content"]
    assert content[0] == {"token": " w10", "logprob": -0.1, "bytes": list(b" w10"),
                          "top_logprobs": [
                              {"token": " w10", "logprob": -0.1, "bytes": list(b" w10")},
                              {"token": " w11", "logprob": -2.0, "bytes": list(b" w11")}]}
    assert content[1]["logprob"] == LOGPROB_FLOOR  # JSON has no -inf
    assert json.loads(json.dumps(body)) == body
    assert ChatShape("c", "m").full(final("x"))["choices"][0]["logprobs"] is None


def test_n_choices_in_index_order_with_their_own_logprobs_and_one_usage() -> None:
    shape = ChatShape("c", "m", tokens=TEXT)
    events = [ev(0, 10, " w10", choice=0), ev(0, 20, " w20", choice=1),
              ev(1, 21, " w21", choice=1)]
    choices = (ChoiceFinal(0, " w10", "stop", 1), ChoiceFinal(1, " w20 w21", "length", 2))
    body = shape.full(final(" w10", choices=choices, completion=3), events)
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert [c["message"]["content"] for c in body["choices"]] == [" w10", " w20 w21"]
    assert [c["finish_reason"] for c in body["choices"]] == ["stop", "length"]
    assert [len(c["logprobs"]["content"]) for c in body["choices"]] == [1, 2]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}


def test_stream_of_two_choices_tags_every_chunk_with_its_index() -> None:
    shape = ChatShape("c", "m")
    chunks = []
    for e in (ev(0, 10, " a", 0), ev(0, 20, " b", 1), ev(1, 11, "", 0), ev(1, 21, " c", 1)):
        chunks += shape.on_token(e)
    choices = (ChoiceFinal(0, " a", "stop", 2), ChoiceFinal(1, " b c", "length", 2))
    chunks += shape.on_final(final(choices=choices))
    by_choice: dict[int, list[dict[str, Any]]] = {0: [], 1: []}
    for chunk in chunks:
        [choice] = chunk["choices"]
        by_choice[choice["index"]].append(choice)
    for index, text, reason in ((0, " a", "stop"), (1, " b c", "length")):
        mine = by_choice[index]
        assert mine[0]["delta"]["role"] == "assistant"
        assert sum("role" in c["delta"] for c in mine) == 1
        assert "".join(c["delta"].get("content") or "" for c in mine) == text
        assert [c["finish_reason"] for c in mine if c["finish_reason"]] == [reason]
        assert mine[-1]["finish_reason"] == reason


def test_streamed_logprobs_of_held_text_ride_on_the_next_chunk() -> None:
    shape = ChatShape("c", "m", tokens=TEXT)
    [opening] = shape.on_token(ev(0, 10, "", lp=-1.0))  # text held by the stop-string check
    assert opening["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert opening["choices"][0]["logprobs"]["content"] == []
    assert shape.on_token(ev(1, 11, "", lp=-2.0)) == []
    [chunk] = shape.on_token(ev(2, 12, " w11 w12", lp=-3.0))
    assert [e["logprob"] for e in chunk["choices"][0]["logprobs"]["content"]] == [
        -1.0, -2.0, -3.0]


def test_a_stream_opens_with_the_role_alone_as_openai_and_llama_server_send_it() -> None:
    shape = ChatShape("c", "m")
    opening, text = shape.on_token(ev(0, 10, "Hi"))
    assert opening["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert text["choices"][0]["delta"] == {"content": "Hi"}
    assert opening["system_fingerprint"] == text["system_fingerprint"]
    assert text["system_fingerprint"].startswith("b")
    silent = ChatShape("c", "m")  # no token at all: the role still comes first
    deltas = [c["choices"][0]["delta"] for c in silent.on_final(final(""))]
    assert deltas == [{"role": "assistant", "content": None}, {}]


def test_a_streamed_tool_call_is_held_back_and_sent_parsed() -> None:
    shape = ChatShape("c", "m", tool_names=["get_weather"])
    call = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    chunks = []
    for i, piece in enumerate([" ", call[:10], call[10:30], call[30:]]):
        chunks += shape.on_token(ev(i, 10 + i, piece))
    assert [c["choices"][0]["delta"] for c in chunks] == [{"role": "assistant", "content": None}]
    end = shape.on_final(final(call))
    delta = end[0]["choices"][0]["delta"]
    assert delta["content"] is None
    [tool_call] = delta["tool_calls"]
    assert tool_call["index"] == 0 and tool_call["type"] == "function"
    assert tool_call["id"].startswith("call_")
    assert tool_call["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    assert end[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_streamed_text_that_is_not_a_call_flows_at_once_or_at_the_end() -> None:
    prose = ChatShape("c", "m", tool_names=["get_weather"])
    opening, chunk = prose.on_token(ev(0, 10, "Sunny"))
    assert opening["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert chunk["choices"][0]["delta"] == {"content": "Sunny"}
    almost = ChatShape("c", "m", tool_names=["get_weather"])
    almost.on_token(ev(0, 10, '{"answer": 4'))
    end = almost.on_final(final('{"answer": 4'))
    assert end[0]["choices"][0]["delta"]["content"] == '{"answer": 4'
    assert end[-1]["choices"][0]["finish_reason"] == "length"


def test_non_streamed_tool_call() -> None:
    shape = ChatShape("c", "m", tool_names=["get_weather"])
    body = shape.full(final('{"name": "get_weather", "arguments": {"city": "Oslo"}}'))
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_completion_logprobs_with_echo_put_the_prompt_first() -> None:
    prompt_ids = [1, 10, 11]  # BOS, " w10", " w11"
    shape = CompletionShape("cmpl-1", "m", tokens=TEXT, echo=" w10 w11",
                            prompt_ids=prompt_ids)
    top = (TokenLogprob(13, -0.2),)
    events = [ev(0, 12, " w12", lp=-0.7, top=top), ev(1, 13, " w13", lp=-0.2)]
    prompt_lps = (None, TokenLogprob(10, -5.0), TokenLogprob(11, -4.0))
    body = shape.full(final(" w12 w13", prompt_logprobs=prompt_lps), events)
    choice = body["choices"][0]
    assert choice["text"] == " w10 w11 w12 w13"
    lp = choice["logprobs"]
    assert lp["tokens"] == ["", " w10", " w11", " w12", " w13"]
    assert lp["token_logprobs"] == [None, -5.0, -4.0, -0.7, -0.2]
    assert lp["top_logprobs"][0] is None
    assert lp["top_logprobs"][3] == {" w13": -0.2, " w12": -0.7}  # the sampled one added
    assert lp["text_offset"] == [0, 0, 4, 8, 12]


def test_completion_stream_with_logprobs_and_echo_of_the_prompt_text() -> None:
    shape = CompletionShape("c", "m", tokens=TEXT, echo="hi")
    [chunk] = shape.on_token(ev(0, 12, " w12", lp=-0.7))
    choice = chunk["choices"][0]
    assert choice["text"] == "hi w12"
    assert choice["logprobs"] == {"tokens": [" w12"], "token_logprobs": [-0.7],
                                  "top_logprobs": [{" w12": -0.7}], "text_offset": [2]}
