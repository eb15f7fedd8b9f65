"""A completion model (no chat template in its file, none configured): listed as such, and
a chat request to it is a clear 400 ``model_has_no_chat_template`` in the shape of the API
it came through, never text in the wrong format; its completions are served, and so is
everything after. The synthetic backend's ``completion_only`` option stands for a base
GGUF; the real one is in ``tests/llm/test_first_chat.py``."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import openai
import pytest

from sluice.v1 import inference_pb2 as pb
from tests.server.grpcclient import failure, grpc_target, stub
from tests.server.live import LiveServer, assert_error, config_with, synth_chat

BASE = "base"
CHAT = "chat"
MESSAGES = [{"role": "user", "content": "a b c"}]


@pytest.fixture(scope="module")
def live(serve_module: Callable[..., LiveServer]) -> LiveServer:
    return serve_module(config_with(
        models=[synth_chat(BASE, completion_only=True), synth_chat(CHAT)],
        server={"grpc_port": 0}))


def test_the_listing_names_the_completion_model(live: LiveServer) -> None:
    with live.client() as c:
        models = {m["id"]: m for m in c.get("/v1/models").json()["data"]}
    assert models[BASE]["capabilities"] == ["completion"]
    assert models[BASE]["chat_template"] is None
    assert models[CHAT]["capabilities"] == ["completion", "chat"]
    with grpc.insecure_channel(grpc_target(live)) as channel:
        listed = {m.id: m for m in stub(channel).ListModels(pb.ListModelsRequest(),
                                                            timeout=30).models}
    assert set(listed) == {BASE, CHAT} and listed[BASE].kind == "generative"


def test_chat_to_a_completion_model_is_400_in_every_api_and_it_serves_on(
    live: LiveServer,
) -> None:
    with live.client() as c:
        for path, body in [
            ("/v1/chat/completions", {"model": BASE, "messages": MESSAGES, "max_tokens": 2}),
            ("/v1/chat/completions", {"model": BASE, "messages": MESSAGES, "stream": True}),
            ("/v1/infer", {"model": BASE, "input": MESSAGES}),
            ("/tokenize", {"model": BASE, "messages": MESSAGES}),
        ]:
            err = assert_error(c.post(path, json=body), 400, code="model_has_no_chat_template",
                               param="model")
            assert "completion model" in err["message"] and "chat_template" in err["message"]
        # the same model's completions, and another model's chat, are served
        done = c.post("/v1/completions", json={"model": BASE, "prompt": "a b", "max_tokens": 3})
        assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 3
        assert c.post("/v1/infer", json={"model": BASE, "input": "a b",
                                         "max_new_tokens": 2}).status_code == 200
        assert c.post("/tokenize", json={"model": BASE, "content": "a b"}).status_code == 200
    with openai.OpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0) as oai:
        with pytest.raises(openai.BadRequestError) as refused:
            oai.chat.completions.create(model=BASE, messages=MESSAGES, max_tokens=2)  # type: ignore[arg-type]
        assert refused.value.code == "model_has_no_chat_template"
        answer = oai.chat.completions.create(model=CHAT, messages=MESSAGES, max_tokens=2)  # type: ignore[arg-type]
        assert answer.choices[0].finish_reason == "length"
    with grpc.insecure_channel(grpc_target(live)) as channel:
        with pytest.raises(grpc.RpcError) as rpc:
            list(stub(channel).Generate(pb.GenerateRequest(
                model=BASE, messages=pb.ChatMessages(messages=[pb.ChatMessage(
                    role="user", content="a b c")]), max_tokens=2), timeout=30))
        f = failure(rpc.value)
        assert f.code == grpc.StatusCode.INVALID_ARGUMENT
        assert f.reason == "model_has_no_chat_template"
        out = list(stub(channel).Generate(pb.GenerateRequest(model=BASE, prompt="a b",
                                                             max_tokens=2), timeout=30))
        assert out[-1].WhichOneof("event") == "done"
