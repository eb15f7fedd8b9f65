"""llama-server's native endpoints (``/completion``, ``/infill``, ``/apply-template``,
``/props``, ``/slots``) over HTTP against a real uvicorn server on the synthetic backend:
their shapes, what each field does, and bad input answered in llama-server's error shape
with the server serving a real request afterwards."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from sluice.backends.base import FimTokens
from sluice.server.llama_wire import InfillRequest, infill_pieces
from tests.server.live import (
    LiveServer,
    assert_error,
    config_with,
    error_keys,
    synth_chat,
    wait_for,
)

CHAT, BYTES, FIM, SHORT, PLAIN = "chat", "bytes", "fim", "short", "plain"
LLAMA_ERROR_KEYS = {"code", "message", "type"}


@pytest.fixture(scope="module")
def live(serve_module: Callable[..., LiveServer]) -> LiveServer:
    return serve_module(config_with(
        models=[synth_chat(CHAT), synth_chat(BYTES, byte_tokens=True, vocab_size=300),
                synth_chat(FIM, fim=True), synth_chat(SHORT, n_ctx_per_seq=32),
                synth_chat(PLAIN, completion_only=True)],
        workers={"count": 1, "budget_bytes": 1_000_000_000}))


def assert_llama_error(r: httpx.Response, status: int, etype: str,
                       text: str | None = None) -> dict[str, Any]:
    """Exactly llama-server's error body, ``code`` the status."""
    assert r.status_code == status, r.text
    assert r.headers.get("x-request-id")
    body = r.json()
    assert set(body) == {"error"}, body
    assert error_keys(body["error"]) == LLAMA_ERROR_KEYS, body
    err: dict[str, Any] = body["error"]
    assert err["code"] == status and err["type"] == etype and err["message"]
    if text is not None:
        assert text in err["message"], err
    return err


def served(c: httpx.Client) -> None:
    """A plain request is still served."""
    r = c.post("/completion", json={"prompt": "hello", "n_predict": 2})
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 2


def stream_chunks(c: httpx.Client, body: dict[str, Any],
                  path: str = "/completion") -> list[dict[str, Any]]:
    with c.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: {") for line in lines), lines  # no [DONE]
    return [json.loads(line[len("data: "):]) for line in lines]


# -- /completion ------------------------------------------------------------------------


def test_completion_result(live: LiveServer) -> None:
    with live.client() as c:
        r = c.post("/completion", json={"prompt": "hello world", "n_predict": 4,
                                        "cache_prompt": True, "id_slot": 0})
        assert r.status_code == 200, r.text
        body = r.json()
    assert body["model"] == CHAT and body["stop"] is True and body["tokens"] == []
    assert body["content"].count(" w") == 4  # the synthetic model's words
    assert body["tokens_predicted"] == 4 and body["tokens_evaluated"] == 3  # BOS + 2 words
    assert body["stop_type"] == "limit" and body["stopping_word"] == ""
    assert body["truncated"] is False and body["has_new_line"] is False
    timings = body["timings"]
    assert timings["prompt_n"] + timings["cache_n"] == 3 and timings["predicted_n"] == 4
    assert timings["prompt_ms"] >= 0 and timings["predicted_per_second"] >= 0
    settings = body["generation_settings"]
    assert settings["n_predict"] == 4 and settings["seed"] == 0xFFFFFFFF
    assert settings["samplers"][-1] == "temperature" and settings["temperature"] == 0.8


def test_completions_is_the_native_completion(live: LiveServer) -> None:
    with live.client() as c:
        native = c.post("/completions", json={"prompt": "hello", "n_predict": 2,
                                              "temperature": 0}).json()
        same = c.post("/completion", json={"prompt": "hello", "n_predict": 2,
                                           "temperature": 0}).json()
    assert native["content"] == same["content"] and native["tokens_predicted"] == 2


@pytest.mark.parametrize(("prompt", "n_prompt"), [
    ([5, 6, 7], 3),
    ([5, "hello world", 6], 4),  # no BOS: the prompt starts with a token id
    (["hello", 5], 3),  # BOS, then the text, then the id
])
def test_prompt_as_token_ids_or_a_mix(live: LiveServer, prompt: list[Any],
                                      n_prompt: int) -> None:
    with live.client() as c:
        r = c.post("/completion", json={"prompt": prompt, "n_predict": 1})
        assert r.status_code == 200, r.text
        assert r.json()["tokens_evaluated"] == n_prompt


def test_several_prompts_are_answered_as_a_list_in_order(live: LiveServer) -> None:
    """A list holding prompts (token ids, text, ``{"prompt_string": text}``) runs each as
    a request of its own, as llama-server does; one prompt object alone is one prompt."""
    with live.client() as c:
        alone = {p: c.post("/completion", json={"prompt": p, "n_predict": 3,
                                                "temperature": 0}).json()
                 for p in ("one two", "three")}
        r = c.post("/completion", json={"prompt": [[5, 6, 7], "one two",
                                                   {"prompt_string": "three"}],
                                        "n_predict": 3, "temperature": 0})
        assert r.status_code == 200, r.text
        first, second, third = r.json()
        assert first["tokens_evaluated"] == 3
        assert second["content"] == alone["one two"]["content"]
        assert third["content"] == alone["three"]["content"]
        one = c.post("/completion", json={"prompt": {"prompt_string": "three"},
                                          "n_predict": 3, "temperature": 0}).json()
        assert one["content"] == alone["three"]["content"]
        assert_llama_error(c.post("/completion", json={"prompt": [[5], [6]], "stream": True}),
                           400, "invalid_request_error", "prompt")
        assert_llama_error(c.post("/completion", json={"prompt": [[5], [10_000]]}),
                           400, "invalid_request_error", "prompt")
        served(c)


def test_stream_sends_a_chunk_per_token_then_the_result(live: LiveServer) -> None:
    body = {"prompt": "hello", "n_predict": 5, "temperature": 0}
    with live.client() as c:
        chunks = stream_chunks(c, {**body, "timings_per_token": True})
        whole = c.post("/completion", json={**body, "return_tokens": True}).json()
    *tokens, last = chunks
    assert len(tokens) == 5 and all(not t["stop"] and len(t["tokens"]) == 1 for t in tokens)
    assert all("timings" in t for t in tokens)
    assert last["stop"] is True and last["tokens"] == [] and last["stop_type"] == "limit"
    assert last["timings"]["predicted_n"] == 5 and "generation_settings" in last
    assert "".join(t["content"] for t in chunks) == whole["content"]
    assert [t["tokens"][0] for t in tokens] == whole["tokens"]


def test_a_failure_mid_stream_ends_it_with_a_llama_server_error(
        serve: Callable[..., LiveServer]) -> None:
    live = serve(config_with(models=[synth_chat("flaky", fail_on_calls=[3])],
                             workers={"count": 1}))
    with live.client() as c:
        chunks = stream_chunks(c, {"prompt": "hello", "n_predict": 8})
        assert [len(t["tokens"]) for t in chunks[:-1]] == [1, 1]
        assert chunks[-1] == {"error": {"code": 500, "type": "server_error",
                                        "message": "The model failed while running this "
                                                   "request."}}
        served(c)


def test_n_probs_gives_completion_probabilities(live: LiveServer) -> None:
    body = {"prompt": "hello", "n_predict": 3, "n_probs": 4, "temperature": 0}
    with live.client() as c:
        whole = c.post("/completion", json=body).json()
        chunks = stream_chunks(c, body)
    probs = whole["completion_probabilities"]
    assert len(probs) == 3
    for p in probs:
        assert p["logprob"] <= 0 and isinstance(p["token"], str) and isinstance(p["bytes"], list)
        assert len(p["top_logprobs"]) == 4
        assert {"id", "token", "bytes", "logprob"} <= set(p["top_logprobs"][0])
    streamed = [c["completion_probabilities"][0] for c in chunks if not c["stop"]]
    assert [p["id"] for p in streamed] == [p["id"] for p in probs]


def test_post_sampling_probs_report_the_distribution_drawn_from(live: LiveServer) -> None:
    """The synthetic row is 10 and 5 at two ids (or 15 at one) and 0 elsewhere: with
    ``top_k`` 5 (no top-p, no min-p) the chain keeps five candidates, whose
    probabilities are computed here."""
    e = math.exp
    first = {e(10) / (e(10) + e(5) + 3), e(15) / (e(15) + 4)}
    body = {"prompt": "hello", "n_predict": 4, "n_probs": 10, "temperature": 1.0,
            "top_k": 5, "top_p": 1.0, "min_p": 0.0, "seed": 3, "post_sampling_probs": True}
    with live.client() as c:
        whole = c.post("/completion", json=body).json()
        chunks = stream_chunks(c, body)
        greedy = c.post("/completion", json={**body, "temperature": 0}).json()
        none = c.post("/completion", json={**body, "n_probs": 0}).json()
    assert whole["generation_settings"]["post_sampling_probs"] is True
    probs = whole["completion_probabilities"]
    assert len(probs) == whole["tokens_predicted"] > 0
    for p in probs:
        assert set(p) == {"id", "token", "bytes", "prob", "top_probs"}
        top = p["top_probs"]
        assert len(top) == 5  # fewer than n_probs: the kept ones, summing to 1
        assert sum(t["prob"] for t in top) == pytest.approx(1.0)
        assert all(0.0 < t["prob"] <= 1.0 and set(t) == {"id", "token", "bytes", "prob"}
                   for t in top)
        assert [t["prob"] for t in top] == sorted((t["prob"] for t in top), reverse=True)
        assert any(top[0]["prob"] == pytest.approx(f) for f in first)
        assert p["prob"] == {t["id"]: t["prob"] for t in top}[p["id"]]
    streamed = [c["completion_probabilities"][0] for c in chunks if not c["stop"]]
    assert streamed == probs  # seeded: the same tokens and distributions
    for p in greedy["completion_probabilities"]:  # llama-server's point mass
        assert p["prob"] == 1.0 and [(t["id"], t["prob"]) for t in p["top_probs"]] == [
            (p["id"], 1.0)]
    assert "completion_probabilities" not in none


def test_stop_word_and_eos_give_their_stop_type(live: LiveServer,
                                                serve: Callable[..., LiveServer]) -> None:
    with live.client() as c:
        text = c.post("/completion", json={"prompt": "hello", "n_predict": 4,
                                           "temperature": 0}).json()["content"]
        word = text.split()[2]
        r = c.post("/completion", json={"prompt": "hello", "n_predict": 4, "temperature": 0,
                                        "stop": [word]}).json()
    assert r["stop_type"] == "word" and r["stopping_word"] == word
    assert word not in r["content"] and text.startswith(r["content"])
    eos = serve(config_with(models=[synth_chat("eos", eos_at_pos=4)], workers={"count": 1}))
    with eos.client() as c:
        r = c.post("/completion", json={"prompt": "hello", "n_predict": 10}).json()
    assert r["stop_type"] == "eos" and r["tokens_predicted"] < 10


def test_n_predict_minus_one_runs_to_the_end_of_the_context(live: LiveServer) -> None:
    with live.client() as c:
        r = c.post("/completion", json={"model": SHORT, "prompt": "hello", "n_predict": -1})
        body = r.json()
    assert body["tokens_predicted"] == 32 - 2 and body["stop_type"] == "limit"
    assert body["truncated"] is True


def test_samplers_left_out_are_off(live: LiveServer) -> None:
    with live.client() as c:
        r = c.post("/completion", json={"prompt": "hello", "n_predict": 1, "temperature": 0,
                                        "top_p": 0.5, "samplers": ["top-k", "temp"]})
        settings = r.json()["generation_settings"]
        assert settings["samplers"] == ["top_k", "temperature"]
        assert settings["temperature"] == 0 and settings["top_p"] == 1.0
        assert settings["min_p"] == 0.0
        r = c.post("/completion", json={"prompt": "hello", "n_predict": 1, "samplers": "kp",
                                        "temperature": 0})
        settings = r.json()["generation_settings"]
        assert settings["samplers"] == ["top_k", "top_p"] and settings["temperature"] == 1.0


def test_logit_bias_pairs_and_false_ban_a_token(live: LiveServer) -> None:
    body = {"prompt": "hello", "n_predict": 1, "temperature": 0, "return_tokens": True}
    with live.client() as c:
        first = c.post("/completion", json=body).json()["tokens"][0]
        banned = c.post("/completion", json={**body, "logit_bias": [[first, False]]}).json()
        assert banned["tokens"][0] != first
        as_object = c.post("/completion", json={**body, "logit_bias": {str(first): False}})
        assert as_object.json()["tokens"][0] != first


def test_logit_bias_text_keys_bias_each_of_their_tokens(live: LiveServer) -> None:
    """llama-server's text keys: every token of the text gets the bias (one byte a token
    on this model), in the list and the object form; a later key's bias wins."""
    body = {"model": BYTES, "prompt": "hello", "n_predict": 1, "temperature": 0}
    with live.client() as c:
        for bias, want in (([["q", 100]], "q"), ({"q": 100}, "q"),
                           ([["qz", 100], ["q", False]], "z"), ({"zq": 100, "z": -100}, "q")):
            r = c.post("/completion", json={**body, "logit_bias": bias})
            assert r.status_code == 200, r.text
            assert r.json()["content"] == want, bias


def test_grammar_constrains_a_native_completion(live: LiveServer) -> None:
    with live.client() as c:
        r = c.post("/completion", json={"model": BYTES, "prompt": "answer", "n_predict": 20,
                                        "grammar": 'root ::= "yes" | "no"'})
        assert r.status_code == 200, r.text
        assert r.json()["content"] in ("yes", "no")


def test_post_sampling_probs_under_a_grammar_cover_only_what_it_allows(
        live: LiveServer) -> None:
    """The chain's distribution is drawn after the grammar's mask: the first byte is "y" or
    "n", each later one is forced (a point mass)."""
    with live.client() as c:
        r = c.post("/completion", json={
            "model": BYTES, "prompt": "answer", "n_predict": 20, "temperature": 1.0,
            "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 1, "n_probs": 5,
            "post_sampling_probs": True, "grammar": 'root ::= "yes" | "no"'})
    assert r.status_code == 200, r.text
    first, *rest = r.json()["completion_probabilities"]
    assert {t["token"] for t in first["top_probs"]} == {"y", "n"}
    assert sum(t["prob"] for t in first["top_probs"]) == pytest.approx(1.0)
    assert len(rest) == len(r.json()["content"]) - 1
    for p in rest:
        assert p["prob"] == pytest.approx(1.0)
        assert [t["id"] for t in p["top_probs"]] == [p["id"]]


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": 5}, "prompt"),
    ({"prompt": "hi", "n_predict": "many"}, "n_predict"),
    ({"prompt": "hi", "n_predict": -2}, "n_predict"),
    ({"prompt": "hi", "n_predict": 0}, "n_predict"),
    ({"prompt": "hi", "n_probs": 10_000}, "n_probs"),
    ({"prompt": "hi", "temperature": "hot"}, "temperature"),
    ({"prompt": [[1, 2], [3]], "stream": True}, "prompt"),
    ({"prompt": [[1]] * 65}, "prompt"),
    ({"prompt": {"prompt_string": "hi", "multimodal_data": ["x"]}}, "prompt"),
    ({"prompt": [1, True]}, "prompt"),
    ({"prompt": [10_000]}, "prompt"),
    ({"prompt": "hi", "samplers": ["mirostat_v9"]}, "samplers"),
    ({"prompt": "hi", "mirostat": 2}, "mirostat"),
    ({"prompt": "hi", "typical_p": 0.5}, "typical_p"),
    ({"prompt": "hi", "n_probs": 2, "post_sampling_probs": 1}, "post_sampling_probs"),
    ({"prompt": "hi", "n_cmpl": 2}, "n_cmpl"),
    ({"prompt": "hi", "logit_bias": [["", -1]]}, "logit_bias"),
    ({"prompt": "hi", "logit_bias": [[1.5, -1]]}, "logit_bias"),
    ({"prompt": "hi", "id_slot": -5}, "id_slot"),
    ({"prompt": "hi", "grammar": "root ::= ("}, "grammar"),
])
def test_bad_input_gets_a_llama_server_error(live: LiveServer, body: dict[str, Any],
                                             param: str) -> None:
    with live.client() as c:
        assert_llama_error(c.post("/completion", json=body), 400, "invalid_request_error",
                           param)
        served(c)


@pytest.mark.parametrize("body", [{"prompt": "hi " * 600},
                                  {"prompt": "hi", "n_predict": 600}])
def test_past_the_context_is_exceed_context_size_error(live: LiveServer,
                                                       body: dict[str, Any]) -> None:
    with live.client() as c:
        assert_llama_error(c.post("/completion", json=body), 400, "exceed_context_size_error",
                           "context holds 512 tokens")
        served(c)


def test_unknown_model_and_bad_json_in_llama_servers_shape(live: LiveServer) -> None:
    with live.client() as c:
        assert_llama_error(c.post("/completion", json={"prompt": "hi", "model": "nope"}),
                           404, "not_found_error", "nope")
        assert_llama_error(c.post("/completion", content=b"{not json",
                                  headers={"content-type": "application/json"}),
                           400, "invalid_request_error")
        served(c)


# -- /infill ----------------------------------------------------------------------------


def test_infill_pieces_follow_llama_servers_layout() -> None:
    body = InfillRequest.model_validate({
        "input_prefix": "def f(", "input_suffix": "return x", "prompt": "x",
        "input_extra": [{"filename": "a.py", "text": "A = 1"}, {"text": "B = 2"}]})
    plain = FimTokens(prefix=1, suffix=2, middle=3)
    assert infill_pieces(plain, body) == [
        "\n\n--- snippet ---\n\n", "A = 1", "\n\n--- snippet ---\n\n", "B = 2",
        1, "def f(", "x", 2, "return x", 3]
    repo = FimTokens(prefix=1, suffix=2, middle=3, repo=4, file_sep=5)
    assert infill_pieces(repo, body) == [
        4, "myproject\n", 5, "a.py\n", "A = 1", 5, "tmp\n", "B = 2", 5, "filename\n",
        1, "def f(", "x", 2, "return x", 3]


def test_infill_on_a_model_with_fim_tokens(live: LiveServer) -> None:
    with live.client() as c:
        r = c.post("/infill", json={"model": FIM, "input_prefix": "a b", "input_suffix": "c",
                                    "prompt": "d", "n_predict": 3,
                                    "input_extra": [{"text": "x y"}]})
        assert r.status_code == 200, r.text
        body = r.json()
    # BOS, 3 words of snippet separator, x y, PRE, a b, d, SUF, c, MID
    assert body["tokens_evaluated"] == 1 + 3 + 2 + 1 + 2 + 1 + 1 + 1 + 1
    assert body["tokens_predicted"] == 3
    top = 512  # the synthetic vocabulary: its three highest ids are the FIM tokens
    assert f" w{top - 3} w" in body["prompt"] and body["prompt"].endswith(f" w{top - 1}")


@pytest.mark.parametrize("body", [
    {"input_prefix": "a", "input_suffix": "b", "input_extra": [{"filename": "ok"}]},
    {"input_prefix": "a", "input_suffix": "b", "input_extra": [{"text": 456}]},
    {"input_prefix": "a"},
    {"input_prefix": "a", "input_suffix": "b", "prompt": 5},
])
def test_bad_infill_input(live: LiveServer, body: dict[str, Any]) -> None:
    with live.client() as c:
        assert_llama_error(c.post("/infill", json={"model": FIM, **body}), 400,
                           "invalid_request_error")
        served(c)


def test_infill_without_fim_tokens_is_501(live: LiveServer) -> None:
    with live.client() as c:
        r = c.post("/infill", json={"input_prefix": "a", "input_suffix": "b"})
        assert_llama_error(r, 501, "not_supported_error", "Infill is not supported")
        served(c)


# -- /apply-template, /props ------------------------------------------------------------


def test_apply_template_renders_as_a_chat_request_does(live: LiveServer) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    with live.client() as c:
        r = c.post("/apply-template", json={"messages": messages})
        assert r.status_code == 200, r.text
        assert r.json() == {"prompt": "system: be brief user: hi assistant:"}
        closed = c.post("/apply-template", json={"messages": messages,
                                                 "add_generation_prompt": False})
        assert closed.status_code == 200 and closed.json() == {
            "prompt": "system: be brief user: hi"}
        counted = c.post("/chat/completions/input_tokens",
                         json={"messages": messages, "add_generation_prompt": False})
        assert counted.json()["input_tokens"] == len(c.post("/tokenize", json={
            "content": "system: be brief user: hi", "add_special": True}).json()["tokens"])
        ids = c.post("/tokenize", json={"messages": messages, "add_generation_prompt": False,
                                        "add_special_tokens": True}).json()["tokens"]
        assert len(ids) == counted.json()["input_tokens"]
        assert_llama_error(c.post("/apply-template", json={
            "messages": messages, "add_generation_prompt": "no"}), 400,
            "invalid_request_error")
        n = c.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1}
                   ).json()["usage"]["prompt_tokens"]
        tokens = c.post("/tokenize", json={"content": r.json()["prompt"],
                                           "add_special": True}).json()["tokens"]
        assert len(tokens) == n
        assert_llama_error(c.post("/apply-template", json={"model": PLAIN,
                                                           "messages": messages}),
                           400, "invalid_request_error", "completion model")
        assert_llama_error(c.post("/apply-template", json={"messages": []}), 400,
                           "invalid_request_error")
        served(c)


def test_chat_input_tokens_counts_what_a_chat_request_runs(live: LiveServer) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    with live.client() as c:
        n = c.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1}
                   ).json()["usage"]["prompt_tokens"]
        for path in ("/chat/completions/input_tokens", "/v1/chat/completions/input_tokens"):
            r = c.post(path, json={"messages": messages, "max_tokens": 8})
            assert r.status_code == 200, r.text
            assert r.json() == {"input_tokens": n}
        assert_error(c.post("/chat/completions/input_tokens",
                            json={"model": PLAIN, "messages": messages}),
                     400, code="model_has_no_chat_template")
        assert_error(c.post("/chat/completions/input_tokens", json={"messages": []}), 400)
        served(c)


def test_props_is_sleeping_while_the_model_is_unloaded(
        serve: Callable[..., LiveServer]) -> None:
    """``is_sleeping``: the model was unloaded after its keep-alive (llama-server's sleep
    after ``--sleep-idle-seconds``); a request loads it again."""
    sleepy = {**synth_chat(CHAT), "keep_alive": 0}
    live = serve(config_with(models=[sleepy], workers={"count": 1}))
    with live.client() as c:
        assert c.post("/completion", json={"prompt": "hi", "n_predict": 1}).status_code == 200
        wait_for(lambda: c.get("/props").json()["is_sleeping"])
        assert c.get("/health").status_code == 200
        assert c.post("/completion", json={"prompt": "hi", "n_predict": 1}).status_code == 200


def test_props(live: LiveServer) -> None:
    with live.client() as c:
        props = c.get("/props").json()
        assert props["total_slots"] == 8 and props["model_alias"] == CHAT
        assert props["default_generation_settings"]["n_ctx"] == 512
        params = props["default_generation_settings"]["params"]
        assert params["temperature"] == 0.8 and params["n_predict"] == 256
        assert props["chat_template"] == "synthetic" and props["modalities"]["vision"] is False
        assert props["endpoint_slots"] is True and props["build_info"].startswith("sluice")
        assert props["is_sleeping"] is False
        assert c.get("/props", params={"model": SHORT}).json()[
            "default_generation_settings"]["n_ctx"] == 32
        assert_llama_error(c.post("/props", json={}), 501, "not_supported_error")
        assert_llama_error(c.get("/props", params={"model": "nope"}), 404, "not_found_error")
        served(c)


# -- /slots -----------------------------------------------------------------------------


def test_slots_show_a_running_request_and_erase_a_retained_prefix(
        serve: Callable[..., LiveServer]) -> None:
    live = serve(config_with(models=[synth_chat("slow", step_fixed_s=0.02, n_seq_max=1)],
                             workers={"count": 1}))
    prompt = " ".join(f"x{i}" for i in range(20))  # past the engine's 16-token minimum
    with live.client() as c:
        [idle] = c.get("/slots").json()
        assert idle["id"] == 0 and idle["is_processing"] is False and idle["n_ctx"] == 512
        assert c.get("/slots", params={"fail_on_no_slot": 1}).status_code == 200
        with c.stream("POST", "/completion", json={"prompt": prompt, "n_predict": 400,
                                                   "stream": True}) as r:
            rid = int(r.headers["x-sluice-request-id"])
            # One iterator for the whole stream: a discarded `r.iter_lines()` generator closes
            # the connection when it is collected, and the server ends the request as a hang-up.
            lines = r.iter_lines()
            next(lines)  # running now
            [busy] = wait_for(lambda: [s for s in c.get("/slots").json()
                                       if s["is_processing"]])
            assert busy["id_task"] == rid and busy["n_prompt_tokens"] == 21
            assert busy["next_token"][0]["n_decoded"] >= 1
            assert_llama_error(c.get("/slots", params={"fail_on_no_slot": 1}), 503,
                               "unavailable_error", "no slot")
            assert_llama_error(c.post("/slots/0?action=erase"), 503, "unavailable_error",
                               "processing")
        first = c.post("/completion", json={"prompt": prompt, "n_predict": 2}).json()
        assert first["timings"]["cache_n"] == 0
        again = c.post("/completion", json={"prompt": prompt, "n_predict": 2}).json()
        assert again["timings"]["cache_n"] > 0  # the slot kept the prompt's KV
        [kept] = c.get("/slots").json()
        assert kept["is_processing"] is False and kept["n_prompt_tokens"] >= 21
        r = c.post("/slots/0", params={"action": "erase"})
        assert r.status_code == 200
        assert r.json() == {"id_slot": 0, "n_erased": kept["n_prompt_tokens"]}
        assert c.get("/slots").json()[0]["n_prompt_tokens"] == 0
        after = c.post("/completion", json={"prompt": prompt, "n_predict": 2}).json()
        assert after["timings"]["cache_n"] == 0  # erased: the prompt was computed again


@pytest.mark.parametrize(("path", "status", "etype"), [
    ("/slots/99?action=erase", 400, "invalid_request_error"),
    ("/slots/-1?action=erase", 400, "invalid_request_error"),
    ("/slots/x?action=erase", 400, "invalid_request_error"),
    ("/slots/0?action=nuke", 400, "invalid_request_error"),
    ("/slots/0", 400, "invalid_request_error"),
    ("/slots/0?action=save", 501, "not_supported_error"),
    ("/slots/0?action=restore", 501, "not_supported_error"),
])
def test_bad_slot_actions(live: LiveServer, path: str, status: int, etype: str) -> None:
    with live.client() as c:
        assert_llama_error(c.post(path, json={"filename": "x.bin"}), status, etype)
        served(c)


def test_slots_turned_off_answer_501(serve: Callable[..., LiveServer]) -> None:
    live = serve(config_with(models=[synth_chat(CHAT)], workers={"count": 1},
                             server={"slots_endpoint": False}))
    with live.client() as c:
        assert_llama_error(c.get("/slots"), 501, "not_supported_error", "slots")
        assert_llama_error(c.post("/slots/0?action=erase"), 501, "not_supported_error")
        assert c.get("/props").json()["endpoint_slots"] is False
        served(c)
