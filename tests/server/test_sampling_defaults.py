"""Sampling defaults, the same through every API: a field the request sends wins; else the
model file's recommendation (the synthetic backend's ``model_sampling`` option stands for a
GGUF's ``general.sampling.*`` keys); else the model's ``[models.sampling]``; else
llama-server's. What each request ran with is read off the runtime requests the server
built; ``/v1/models`` and gRPC ``ListModels`` agree with it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc
import openai
import pytest

from sluice.engine.request import Request, SamplingParams
from sluice.engine.sampling_defaults import (
    DEFAULTED_FIELDS,
    LLAMA_SERVER_DEFAULTS,
    resolve_defaults,
)
from sluice.v1 import inference_pb2 as pb
from tests.server.grpcclient import grpc_target, stub
from tests.server.live import LiveServer, assert_error, config_with, synth_chat

MODEL = "tuned"
PLAIN = "plain"
FILE_SAYS = {"temperature": 0.3, "top_k": 12}
CONFIG_SAYS = {"temperature": 0.9, "top_p": 0.7, "repeat_penalty": 1.1}
"""``repeat_penalty``: llama-server's name, as a request may spell it too."""


def test_each_field_resolves_on_its_own_file_then_config_then_llama_server() -> None:
    got = resolve_defaults({"temperature": 0.3}, {"temperature": 0.9, "top_p": 0.7})
    assert got.values["temperature"] == 0.3 and got.sources["temperature"] == "model"
    assert got.values["top_p"] == 0.7 and got.sources["top_p"] == "config"
    assert got.values["min_p"] == 0.05 and got.sources["min_p"] == "llama-server"
    assert set(got.values) == set(DEFAULTED_FIELDS)
    assert resolve_defaults({}, {}).values == LLAMA_SERVER_DEFAULTS
    assert LLAMA_SERVER_DEFAULTS["temperature"] == 0.8 and LLAMA_SERVER_DEFAULTS["top_k"] == 40


def test_a_bad_sampling_table_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"sampling\.top_p"):
        config_with(models=[{**synth_chat(MODEL), "sampling": {"top_p": 0}}])
    with pytest.raises(ValueError, match=r"sampling\.temprature"):
        config_with(models=[{**synth_chat(MODEL), "sampling": {"temprature": 0.5}}])


@pytest.fixture(scope="module")
def live(serve_module: Callable[..., LiveServer]) -> LiveServer:
    return serve_module(config_with(
        models=[{**synth_chat(MODEL, model_sampling=FILE_SAYS), "sampling": CONFIG_SAYS},
                synth_chat(PLAIN)],
        server={"grpc_port": 0}))


@pytest.fixture
def built(live: LiveServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Request]]:
    """The runtime requests the server builds during the test, in order."""
    runtime = live.runtime
    seen: list[Request] = []
    new_request = runtime.new_request

    def recording(*args: Any, **kwargs: Any) -> Request:
        req: Request = new_request(*args, **kwargs)
        seen.append(req)
        return req

    monkeypatch.setattr(runtime, "new_request", recording)
    yield seen


def _expect_defaults(params: SamplingParams, **sent: float) -> None:
    want = {"temperature": 0.3, "top_k": 12, "top_p": 0.7, "repetition_penalty": 1.1,
            "min_p": 0.05, "penalty_last_n": 64, "presence_penalty": 0.0,
            "frequency_penalty": 0.0, **sent}
    assert {k: getattr(params, k) for k in want} == pytest.approx(want)


def test_every_api_fills_what_the_request_left_out_the_same_way(
    live: LiveServer, built: list[Request],
) -> None:
    messages = [{"role": "user", "content": "a b c"}]
    with openai.OpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0) as oai:
        oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)  # type: ignore[arg-type]
        oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=2,  # type: ignore[arg-type]
                                    temperature=1.5, top_p=0.5)
        oai.completions.create(model=MODEL, prompt="a b c", max_tokens=2)
        oai.completions.create(model=MODEL, prompt="a b c", max_tokens=2,
                               extra_body={"top_k": 3, "min_p": 0.2})
    with live.client() as c:
        assert c.post("/v1/infer", json={"model": MODEL, "input": "a b c",
                                         "max_new_tokens": 2}).status_code == 200
        assert c.post("/v1/infer", json={"model": MODEL, "input": messages,
                                         "max_new_tokens": 2,
                                         "temperature": 0}).status_code == 200
        # null is "not sent", as an OpenAI client that serialises unset fields sends it
        assert c.post("/v1/chat/completions", json={
            "model": MODEL, "messages": messages, "max_tokens": 2, "temperature": None,
            "top_k": None}).status_code == 200
    with grpc.insecure_channel(grpc_target(live)) as channel:
        list(stub(channel).Generate(pb.GenerateRequest(model=MODEL, prompt="a b c",
                                                       max_tokens=2), timeout=30))
        list(stub(channel).Generate(pb.GenerateRequest(model=MODEL, prompt="a b c",
                                                       max_tokens=2, temperature=0.0,
                                                       top_k=5), timeout=30))
    params = [r.params for r in built]
    assert len(params) == 9
    _expect_defaults(params[0])
    _expect_defaults(params[1], temperature=1.5, top_p=0.5)
    _expect_defaults(params[2])
    _expect_defaults(params[3], top_k=3, min_p=0.2)
    _expect_defaults(params[4])
    _expect_defaults(params[5], temperature=0.0)
    _expect_defaults(params[6])
    _expect_defaults(params[7])
    _expect_defaults(params[8], temperature=0.0, top_k=5)


def test_a_model_with_nothing_configured_gets_llama_servers_defaults(
    live: LiveServer, built: list[Request],
) -> None:
    with live.client() as c:
        r = c.post("/v1/chat/completions", json={
            "model": PLAIN, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2,
            "repeat_last_n": -1})
        assert r.status_code == 200, r.text
    [req] = built
    got = {k: getattr(req.params, k) for k in DEFAULTED_FIELDS}
    assert got == {**LLAMA_SERVER_DEFAULTS, "penalty_last_n": 512}  # -1: the whole context


def test_the_listing_shows_the_defaults_in_force_and_where_each_came_from(
    live: LiveServer,
) -> None:
    with live.client() as c:
        models = {m["id"]: m for m in c.get("/v1/models").json()["data"]}
        one = c.get(f"/v1/models/{MODEL}").json()
    tuned = models[MODEL]
    assert tuned == one
    assert tuned["capabilities"] == ["completion", "chat"]
    assert tuned["sampling_defaults"] == {**LLAMA_SERVER_DEFAULTS, "temperature": 0.3,
                                          "top_k": 12, "top_p": 0.7,
                                          "repetition_penalty": 1.1}
    assert tuned["sampling_defaults_from"] == {
        **{k: "llama-server" for k in DEFAULTED_FIELDS}, "temperature": "model",
        "top_k": "model", "top_p": "config", "repetition_penalty": "config"}
    assert models[PLAIN]["sampling_defaults"] == LLAMA_SERVER_DEFAULTS


def test_bad_sampling_values_are_400s_and_the_server_serves_on(live: LiveServer) -> None:
    with live.client() as c:
        r = c.post("/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": "x"}], "top_p": 0})
        assert_error(r, 400, param="top_p")
        r = c.post("/v1/infer", json={"model": MODEL, "input": "x", "min_p": 2})
        assert_error(r, 400, param="min_p")
        ok = c.post("/v1/completions", json={"model": MODEL, "prompt": "a", "max_tokens": 2})
        assert ok.status_code == 200, ok.text


def test_runtime_generate_takes_the_same_defaults(live: LiveServer) -> None:
    params = live.runtime.sampling_params(MODEL, max_tokens=3, top_k=2)
    _expect_defaults(params, top_k=2)
    assert params.max_tokens == 3

