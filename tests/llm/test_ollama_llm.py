"""Ollama's API on the real model (llama.cpp, the packaged Gemma 3 270M) with the real
``ollama`` client: a raw generate answers the fact, chat runs through the model's own
template, and ``keep_alive: 0`` unloads the model after the request, the next request
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


@pytest.fixture(scope="module")
def live() -> Iterator[LiveServer]:
    config = Config.model_validate({
        "models": [{
            "id": MODEL, "kind": "generative", "backend": "llamacpp", "task": "generation",
            "memory_bytes": 600_000_000, "keep_alive": "5m",
            "options": {"path": "packaged:gemma-3-270m", "n_ctx": 2048, "n_seq_max": 2,
                        "n_threads": 2},
        }],
        "workers": {"count": 1},
    })
    server = start_server(config)
    yield server
    server.stop()


def test_generate_chat_and_keep_alive_on_the_real_model(live: LiveServer) -> None:
    with ollama.Client(host=live.url, timeout=120) as client:
        r = client.generate(model=MODEL, prompt="The capital of France is the city of",
                            raw=True, options={"num_predict": 3, "temperature": 0})
        assert "Paris" in r.response and r.done
        chat = client.chat(model=MODEL, messages=[{"role": "user", "content": "Say hi."}],
                           options={"num_predict": 8, "temperature": 0})
        assert chat.message.content and chat.eval_count and chat.eval_count <= 8
        [loaded] = client.ps().models
        assert loaded.model == MODEL and loaded.context_length == 1024
        client.generate(model=MODEL, prompt="Hello", raw=True, keep_alive=0,
                        options={"num_predict": 1})
        wait_for(lambda: not client.ps().models, timeout_s=30)
        again = client.generate(model=MODEL, prompt="The capital of France is the city of",
                                raw=True, options={"num_predict": 3, "temperature": 0})
        assert "Paris" in again.response
        assert [m.model for m in client.ps().models] == [MODEL]
