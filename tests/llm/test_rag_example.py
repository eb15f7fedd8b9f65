"""``examples/rag.toml`` served as it is: the packaged SmolLM2 chats, the packaged MiniLM
encoder embeds, and the same encoder reranks, ranking documents exactly as the cosine of
their ``/v1/embeddings`` vectors to the query's does."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from sluice.config import load_config
from tests.server.live import ROOT, LiveServer, start_server

pytestmark = pytest.mark.llm
pytest.importorskip("llama_cpp", reason="the llm extra is not installed")

QUERY = "Which planet is known as the red planet?"
DOCS = [
    "Mars is often called the red planet because of the iron oxide on its surface.",
    "A good sourdough starter needs flour, water and patience.",
    "Jupiter is the largest planet in the solar system.",
    "The stock market closed higher on Friday.",
]


@pytest.fixture(scope="module")
def live() -> Iterator[LiveServer]:
    server = start_server(load_config(ROOT / "examples" / "rag.toml"))
    yield server
    server.stop()


def test_rerank_orders_documents_as_the_embeddings_cosine(live: LiveServer) -> None:
    with live.client() as c:
        emb = c.post("/v1/embeddings", json={"model": "minilm-embed", "input": [QUERY, *DOCS]})
        ranked = c.post("/v1/rerank", json={"query": QUERY, "documents": DOCS})
    assert emb.status_code == 200, emb.text
    assert ranked.status_code == 200, ranked.text
    vectors = np.array([d["embedding"] for d in emb.json()["data"]], dtype=np.float32)
    cosine = vectors[1:] @ vectors[0]
    body = ranked.json()
    assert body["model"] == "minilm-rerank"
    assert [x["index"] for x in body["results"]] == list(np.argsort(-cosine))
    assert body["results"][0]["index"] == 0  # Mars
    assert np.allclose([x["relevance_score"] for x in body["results"]],
                       np.sort(cosine)[::-1], atol=1e-4)


def test_the_chat_model_answers_beside_them(live: LiveServer) -> None:
    with live.client() as c:
        r = c.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "smollm2-135m-instruct"
    assert r.json()["usage"]["completion_tokens"] >= 1
