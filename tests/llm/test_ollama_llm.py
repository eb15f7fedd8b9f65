"""Ollama's API on the real models (llama.cpp) with the real ``ollama`` client: a raw
generate on the completion model (Gemma 3 270M) answers the fact, chat on the chat model
(SmolLM2-135M-Instruct, its own ChatML template) answers a question, chat to the completion
model is refused, and ``keep_alive: 0`` unloads a model after the request, the next request
loading it again."""

from __future__ import annotations

from collections.abc import Iterator

import ollama
import pytest

from sluice.config import Config
from tests.server.live import LiveServer, start_server, wait_for

pytestmark = pytest.mark.llm
pytest.importorskip("llama_cpp", reason="the llm extra is not installed")

MODEL = "gemma-3-270m"
CHAT = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def live() -> Iterator[LiveServer]:
    config = Config.model_validate({
        "models": [{
            "id": model, "kind": "generative", "backend": "llamacpp", "task": "generation",
            "memory_bytes": 600_000_000, "keep_alive": "5m",
            "options": {"path": f"packaged:{model}", "n_ctx": 2048, "n_seq_max": 2,
                        "n_threads": 2},
        } for model in (MODEL, CHAT)],
        "server": {"default_model": MODEL},
        "workers": {"count": 1, "budget_bytes": 2_000_000_000},
    })
    server = start_server(config)
    yield server
    server.stop()


def test_generate_chat_and_keep_alive_on_the_real_model(live: LiveServer) -> None:
    with ollama.Client(host=live.url, timeout=120) as client:
        r = client.generate(model=MODEL, prompt="The capital of France is the city of",
                            raw=True, options={"num_predict": 3, "temperature": 0})
        assert "Paris" in r.response and r.done
        question = "What is the capital of France? Answer in one word."
        chat = client.chat(model=CHAT, messages=[{"role": "user", "content": question}],
                           options={"num_predict": 16, "temperature": 0})
        assert "Paris" in chat.message.content and chat.eval_count <= 16
        with pytest.raises(ollama.ResponseError) as refused:
            client.chat(model=MODEL, messages=[{"role": "user", "content": "Say hi."}])
        assert refused.value.status_code == 400 and "chat template" in refused.value.error
        loaded = {m.model: m for m in client.ps().models}
        assert set(loaded) == {MODEL, CHAT} and loaded[MODEL].context_length == 1024
        client.generate(model=MODEL, prompt="Hello", raw=True, keep_alive=0,
                        options={"num_predict": 1})
        wait_for(lambda: [m.model for m in client.ps().models] == [CHAT], timeout_s=30)
        again = client.generate(model=MODEL, prompt="The capital of France is the city of",
                                raw=True, options={"num_predict": 3, "temperature": 0})
        assert "Paris" in again.response
        assert {m.model for m in client.ps().models} == {MODEL, CHAT}
