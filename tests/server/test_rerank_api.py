"""Rerank (``/v1/rerank`` and llama-server's aliases) against a real uvicorn server with the
real ONNX reranker: the packaged all-MiniLM-L6-v2 encoder as a bi-encoder (cosine of the
query's and each document's embedding), beside a synthetic chat model (the default) and a
synthetic embedding model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer as HFTokenizer

from sluice.backends.onnx import Encoder
from sluice.backends.packaged import MINILM_ENCODER_ID, packaged_encoder_files
from tests.server.live import (
    LiveServer,
    assert_error,
    config_with,
    synth_chat,
    synth_embed,
    synth_rerank,
)

RERANKER = "minilm-rerank"
QUERY = "What is the capital of France?"
DOCS = [
    "Bananas are a yellow fruit, rich in potassium.",
    "Paris is the capital and the largest city of France.",
    "GPUs multiply matrices quickly, which speeds up deep learning.",
]
MAX_DOCUMENTS = 16
DROP = object()
"""A field value meaning: leave the field out of the body."""


def reranker_entry(model_id: str = RERANKER) -> dict[str, Any]:
    return {"id": model_id, "kind": "oneshot", "backend": "onnx", "task": "rerank",
            "memory_bytes": 200_000_000, "load_cost_s": 0.5,
            "options": {"path": f"packaged:{MINILM_ENCODER_ID}", "threads": 2}}


@pytest.fixture(scope="module")
def live(serve_module: Callable[..., LiveServer]) -> LiveServer:
    return serve_module(config_with(
        models=[synth_chat(), synth_embed(), reranker_entry()],
        workers={"count": 1},
        batching={"max_batch_size": 8, "max_wait_ms": 20},
        server={"default_model": "synth-chat", "rerank_max_documents": MAX_DOCUMENTS},
    ))


@pytest.fixture(scope="module")
def reference() -> tuple[Encoder, HFTokenizer]:
    """The same encoder and tokenizer, opened apart from the server."""
    model, tokenizer = packaged_encoder_files(MINILM_ENCODER_ID)
    tok = HFTokenizer.from_file(str(tokenizer))
    tok.no_padding()  # the file pads every text to 128
    return Encoder(model, tokenizer), tok


def rerank(live: LiveServer, path: str = "/v1/rerank", **body: Any) -> Any:
    with live.client() as c:
        r = c.post(path, json={"query": QUERY, "documents": DOCS, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_the_relevant_document_is_ranked_first_with_the_encoders_cosine(
    live: LiveServer, reference: tuple[Encoder, HFTokenizer]
) -> None:
    with live.client() as c:
        r = c.post("/v1/rerank", json={"model": RERANKER, "query": QUERY, "documents": DOCS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"id", "model", "object", "results", "usage"}
    assert body["model"] == RERANKER and body["object"] == "list"
    results = body["results"]
    assert results[0]["index"] == 1  # Paris
    assert sorted(x["index"] for x in results) == [0, 1, 2]
    scores = [x["relevance_score"] for x in results]
    assert scores == sorted(scores, reverse=True)
    assert all(set(x) == {"index", "relevance_score"} for x in results)
    encoder, tok = reference
    vectors = encoder.embed([QUERY, *DOCS])
    cosine = vectors[1:] @ vectors[0]
    served = np.array([next(x["relevance_score"] for x in results if x["index"] == i)
                       for i in range(len(DOCS))])
    assert np.allclose(served, cosine, atol=1e-4), (served, cosine)
    assert served[1] > 0.5 > max(served[0], served[2])
    n_tokens = sum(len(tok.encode(t).ids) for t in [QUERY, *DOCS])  # the query once
    assert body["usage"] == {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
    # each document was a request of its own on the one-shot lane, batched together
    assert int(r.headers["x-sluice-batch-size"]) > 1
    assert r.headers["x-request-id"]


def test_without_a_model_the_configured_reranker_serves(live: LiveServer) -> None:
    named = rerank(live, model=RERANKER)
    unnamed = rerank(live)  # the default model (synth-chat) does not rerank
    assert unnamed["model"] == RERANKER
    assert unnamed["results"] == named["results"]


def test_top_n_and_return_documents(live: LiveServer) -> None:
    full = rerank(live)["results"]
    assert rerank(live, top_n=1)["results"] == full[:1]
    assert rerank(live, top_n=2)["results"] == full[:2]
    assert rerank(live, top_n=0)["results"] == full  # vLLM's 0: every document
    assert rerank(live, top_n=99)["results"] == full
    with_docs = rerank(live, top_n=2, return_documents=True)["results"]
    assert [x["document"] for x in with_docs] == [{"text": DOCS[x["index"]]} for x in full[:2]]
    assert [(x["index"], x["relevance_score"]) for x in with_docs] == [
        (x["index"], x["relevance_score"]) for x in full[:2]]


def test_documents_as_jina_objects_rank_as_strings(live: LiveServer) -> None:
    as_strings = rerank(live)
    as_objects = rerank(live, documents=[{"text": d} for d in DOCS], return_documents=True)
    assert [(x["index"], x["relevance_score"]) for x in as_objects["results"]] == [
        (x["index"], x["relevance_score"]) for x in as_strings["results"]]
    assert as_objects["usage"] == as_strings["usage"]
    assert as_objects["results"][0]["document"] == {"text": DOCS[1]}


@pytest.mark.parametrize("path", ["/rerank", "/v1/reranking", "/reranking"])
def test_llama_servers_aliases_answer_alike(live: LiveServer, path: str) -> None:
    assert rerank(live, path)["results"] == rerank(live)["results"]


def test_texts_get_teis_bare_list(live: LiveServer) -> None:
    jina = rerank(live)["results"]
    with live.client() as c:
        r = c.post("/rerank", json={"query": QUERY, "texts": DOCS, "top_n": 2,
                                    "return_text": True})
    assert r.status_code == 200, r.text
    assert r.json() == [{"index": x["index"], "score": x["relevance_score"],
                         "text": DOCS[x["index"]]} for x in jina[:2]]


BAD: list[tuple[str, dict[str, Any], int, str, str | None]] = [
    ("empty documents", {"documents": []}, 400, "invalid_value", "documents"),
    ("null documents", {"documents": None}, 400, "invalid_value", "documents"),
    ("documents not a list", {"documents": 123}, 400, "invalid_value", "documents"),
    ("documents of numbers", {"documents": [1, 2, 3]}, 400, "invalid_value", "documents.0"),
    ("a document object without text", {"documents": [{"txt": "a"}]}, 400, "invalid_value",
     "documents.0.text"),
    ("too many documents", {"documents": ["d"] * (MAX_DOCUMENTS + 1)}, 400, "invalid_value",
     "documents"),
    ("no query", {"query": DROP}, 400, "invalid_value", "query"),
    ("a query that is not text", {"query": 5}, 400, "invalid_value", "query"),
    ("negative top_n", {"top_n": -1}, 400, "invalid_value", "top_n"),
    ("documents and texts", {"texts": ["x"]}, 400, "invalid_value", "texts"),
    ("unknown model", {"model": "bge-reranker-v9"}, 404, "model_not_found", "model"),
    ("a generative model", {"model": "synth-chat"}, 400, "model_kind_mismatch", "model"),
    ("an embedding model", {"model": "synth-a"}, 400, "model_kind_mismatch", "model"),
]


@pytest.mark.parametrize(("change", "status", "code", "param"),
                         [row[1:] for row in BAD], ids=[row[0] for row in BAD])
def test_bad_input_is_refused_in_openais_shape_then_a_request_is_served(
    live: LiveServer, change: dict[str, Any], status: int, code: str, param: str | None
) -> None:
    body = {"query": QUERY, "documents": DOCS, **change}
    with live.client() as c:
        err = assert_error(c.post("/v1/rerank", json={k: v for k, v in body.items()
                                                      if v is not DROP}),
                           status, code=code, param=param)
        if code == "model_kind_mismatch":
            assert "rerank" in err["message"]
        ok = c.post("/v1/rerank", json={"query": QUERY, "documents": DOCS})
    assert ok.status_code == 200, ok.text
    assert ok.json()["results"][0]["index"] == 1


def test_a_reranker_is_not_served_one_text_at_a_time(live: LiveServer) -> None:
    with live.client() as c:
        err = assert_error(c.post("/v1/infer", json={"model": RERANKER, "input": QUERY}),
                           400, code="model_kind_mismatch", param="model")
        assert "/v1/rerank" in err["message"]
        assert_error(c.post("/v1/embeddings", json={"model": RERANKER, "input": QUERY}),
                     400, code="model_kind_mismatch", param="model")


def test_priority_and_an_impossible_deadline(live: LiveServer) -> None:
    with live.client() as c:
        r = c.post("/v1/rerank", json={"query": QUERY, "documents": DOCS, "priority": 7})
        assert r.status_code == 200, r.text
        assert r.headers["x-sluice-priority"] == "7"  # below the default tenant's 5
        late = c.post("/v1/rerank", json={"query": QUERY, "documents": DOCS,
                                          "deadline_ms": 0.001})
        assert_error(late, 503, code="deadline_infeasible")
        assert int(late.headers["retry-after"]) >= 1


def test_a_server_without_a_reranker_answers_501(synthetic_server: LiveServer) -> None:
    with synthetic_server.client() as c:
        err = assert_error(c.post("/v1/rerank", json={"query": QUERY, "documents": DOCS}),
                           501, code="rerank_not_supported")
        assert 'task = "rerank"' in err["message"]
        # a malformed body is the client's error whatever the server serves: 400 first
        assert_error(c.post("/v1/rerank", json={"query": QUERY, "documents": []}), 400,
                     param="documents")
        chat = c.post("/v1/chat/completions", json={
            "model": "synth-chat", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2})
    assert chat.status_code == 200, chat.text


def test_a_rerank_is_one_request_to_the_tenants_quota(serve: Callable[..., LiveServer]) -> None:
    """Its documents are admitted as one unit: a burst of one admits a three-document
    rerank whole, and refuses the next with 429 and a Retry-After (on the synthetic
    reranker, which scores by word overlap)."""
    live = serve(config_with(
        models=[synth_chat(), synth_rerank()],
        tenants=[{"id": "small", "api_keys": ["sk-small"],
                  "limits": {"requests_per_s": 0.001, "burst": 1}},
                 {"id": "big", "api_keys": ["sk-big"]}]))
    body = {"query": "capital of France", "documents": DOCS}
    with live.client() as c:
        first = c.post("/v1/rerank", json=body, headers={"authorization": "Bearer sk-small"})
        assert first.status_code == 200, first.text
        assert first.json()["results"][0]["index"] == 1  # Paris holds all three words
        assert first.json()["model"] == "synth-rerank"
        again = c.post("/v1/rerank", json=body, headers={"authorization": "Bearer sk-small"})
        assert_error(again, 429, code="quota")
        assert int(again.headers["retry-after"]) >= 1
        other = c.post("/v1/rerank", json=body, headers={"authorization": "Bearer sk-big"})
        assert other.status_code == 200, other.text
