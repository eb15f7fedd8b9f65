"""Embeddings from a GGUF (llama.cpp pooling) on the packaged SmolLM2: a generative model with
``[models.embeddings]`` embeds through its one-shot ``MODEL:embedding`` on ``/v1/embeddings``,
Ollama's ``/api/embed`` and ``/api/embeddings`` (the real ``ollama`` client); one without is a
400 that names ``--embedding``, and the server serves on after it."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import numpy as np
import ollama
import pytest

from sluice.config import Config
from tests.server.live import LiveServer, assert_error, start_server

pytestmark = pytest.mark.llm
llama_cpp = pytest.importorskip("llama_cpp", reason="the llm extra is not installed")

MEAN, LAST, PLAIN = "chat-mean", "chat-last", "chat-plain"
TEXTS = ["The cat sat on the mat.", "Stock markets fell sharply today.",
         "The cat sat on the mat."]


def _n_embd() -> int:
    """SmolLM2's embedding width, read from its GGUF."""
    from sluice.backends.llamacpp.native import init_llama
    from sluice.backends.packaged import smollm2_gguf_path

    lib = init_llama(False)
    params = lib.llama_model_default_params()
    params.vocab_only = True
    model = lib.llama_model_load_from_file(str(smollm2_gguf_path()).encode(), params)
    try:
        buf = ctypes.create_string_buffer(32)
        lib.llama_model_meta_val_str(model, b"llama.embedding_length", buf, len(buf))
        return int(buf.value.decode())
    finally:
        lib.llama_model_free(model)


def _model(model_id: str, pooling: str | None) -> dict[str, object]:
    entry: dict[str, object] = {
        "id": model_id, "kind": "generative", "backend": "llamacpp", "task": "generation",
        "memory_bytes": 300_000_000,
        "options": {"path": "packaged:smollm2-135m-instruct", "n_ctx": 1024, "n_seq_max": 2,
                    "n_threads": 2}}
    if pooling is not None:
        entry["embeddings"] = {"pooling": pooling, "n_ctx": 256,
                               "memory_bytes": 150_000_000}
    return entry


@pytest.fixture(scope="module")
def live() -> Iterator[LiveServer]:
    config = Config.model_validate({
        "models": [_model(MEAN, "mean"), _model(LAST, "last"), _model(PLAIN, None)],
        "server": {"default_model": MEAN},
        "workers": {"count": 1, "budget_bytes": 2_000_000_000},
    })
    server = start_server(config)
    yield server
    server.stop()


def test_a_generative_gguf_embeds_through_its_embedding_model(live: LiveServer) -> None:
    n_embd = _n_embd()
    with live.client(timeout=120) as http:
        r = http.post("/v1/embeddings", json={"model": MEAN, "input": TEXTS})
        assert r.status_code == 200, r.text
        vectors = np.array([d["embedding"] for d in r.json()["data"]])
        assert vectors.shape == (3, n_embd)
        np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
        np.testing.assert_allclose(vectors[0], vectors[2], atol=1e-6)  # same text, same vector
        assert float(vectors[0] @ vectors[1]) < 0.99  # different texts differ
        # usage: the tokens the model read (its own tokenizer, BOS included), not words
        counts = [http.post("/tokenize", json={"model": MEAN, "prompt": t,
                                               "add_special_tokens": True}).json()["count"]
                  for t in TEXTS]
        assert counts[0] != len(TEXTS[0].split())
        usage = r.json()["usage"]
        assert usage["prompt_tokens"] == usage["total_tokens"] == sum(counts)
        # alone, in another batch: the same vector; no model named: the default model's
        alone = http.post("/v1/embeddings", json={"input": TEXTS[0]})
        np.testing.assert_allclose(alone.json()["data"][0]["embedding"], vectors[0],
                                   atol=1e-5)
        # the pooling is the model's: last-token pooling gives other vectors
        last = http.post("/v1/embeddings", json={"model": LAST, "input": TEXTS[0]})
        assert last.status_code == 200, last.text
        assert float(np.dot(last.json()["data"][0]["embedding"], vectors[0])) < 0.99
        listed = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
        assert listed[f"{MEAN}:embedding"]["kind"] == "oneshot"
        assert listed[f"{MEAN}:embedding"]["task"] == "embedding"
        assert listed[f"{MEAN}:embedding"]["state"] == "loaded"
        assert f"{PLAIN}:embedding" not in listed
        # a model of its own in residency, at its own memory estimate
        [worker] = live.runtime.snapshot().workers
        resident = {m.model_id: m.memory_bytes for m in worker.models}
        assert resident[f"{MEAN}:embedding"] == 150_000_000
    with ollama.Client(host=live.url, timeout=120) as client:
        embed = client.embed(model=MEAN, input=TEXTS[:2])
        np.testing.assert_allclose(np.array(embed.embeddings), vectors[:2], atol=1e-5)
        assert embed.prompt_eval_count == sum(counts[:2])
        older = client.embeddings(model=MEAN, prompt=TEXTS[1])
        np.testing.assert_allclose(older.embedding, vectors[1], atol=1e-5)
        assert "embedding" in client.show(MEAN).capabilities


def test_a_model_without_embeddings_is_refused_then_the_server_serves(
        live: LiveServer) -> None:
    with live.client(timeout=120) as http:
        r = http.post("/v1/embeddings", json={"model": PLAIN, "input": "hello"})
        assert_error(r, 400, code="model_kind_mismatch")
        assert "--embedding" in r.json()["error"]["message"]
        ok = http.post("/v1/completions", json={"model": PLAIN, "prompt": "Hello",
                                                "max_tokens": 2})
        assert ok.status_code == 200, ok.text
    with ollama.Client(host=live.url, timeout=120) as client, \
            pytest.raises(ollama.ResponseError) as refused:
        client.embed(model=PLAIN, input="hello")
    assert refused.value.status_code == 400 and "--embedding" in refused.value.error


def test_a_one_model_server_serves_any_name_with_embeddings_on() -> None:
    """``--embedding`` adds the model's ``MODEL:embedding`` beside it, but the server still
    holds one configured model: with ``unknown_model = "default"`` a name it does not know
    is served by that model on chat and on embeddings (llama-server's way), not 404."""
    config = Config.model_validate({
        "models": [_model(MEAN, "mean")],
        "server": {"default_model": MEAN, "unknown_model": "default"},
        "workers": {"count": 1, "budget_bytes": 2_000_000_000},
    })
    server = start_server(config)
    try:
        with server.client(timeout=120) as http:
            r = http.post("/v1/embeddings", json={"model": "text-embedding-3-small",
                                                  "input": TEXTS[0]})
            assert r.status_code == 200, r.text
            assert len(r.json()["data"][0]["embedding"]) == _n_embd()
            r = http.post("/v1/chat/completions", json={
                "model": "gpt-4o-mini", "max_tokens": 2,
                "messages": [{"role": "user", "content": "Hello"}]})
            assert r.status_code == 200, r.text
            assert r.json()["model"] == MEAN
    finally:
        server.stop()


def test_token_ids_embed_as_their_text_and_a_long_input_is_refused_alone(
        live: LiveServer) -> None:
    """The ids of a text embed to its vector (OpenAI's token-id input); an id outside the
    vocabulary and an input past the embedding context (256 tokens here) are 400s in
    OpenAI's shape (``context_length_exceeded``, "too large", as llama-server words it),
    which Ollama's ``truncate`` (its default) cuts to fit instead; the server serves on."""
    long_text = "This is a test " * 512
    with live.client(timeout=120) as http:
        ids = http.post("/tokenize", json={"model": MEAN, "prompt": TEXTS[0],
                                           "add_special_tokens": True}).json()["tokens"]
        text = http.post("/v1/embeddings", json={"model": MEAN, "input": TEXTS[0]}).json()
        by_ids = http.post("/v1/embeddings", json={"model": MEAN, "input": ids})
        assert by_ids.status_code == 200, by_ids.text
        np.testing.assert_allclose(by_ids.json()["data"][0]["embedding"],
                                   text["data"][0]["embedding"], atol=1e-5)
        assert by_ids.json()["usage"]["prompt_tokens"] == len(ids)
        two = http.post("/v1/embeddings", json={"model": MEAN, "input": [ids, ids[:3]]})
        assert two.status_code == 200 and len(two.json()["data"]) == 2
        outside = http.post("/v1/embeddings", json={"model": MEAN,
                                                    "input": [[1, 10**9], TEXTS[1]]})
        assert_error(outside, 400, code="invalid_request_error")
        assert "vocabulary" in outside.json()["error"]["message"]
        too_long = http.post("/v1/embeddings", json={"model": MEAN, "input": long_text})
        assert_error(too_long, 400, code="context_length_exceeded")
        assert "too large" in too_long.json()["error"]["message"]
        again = http.post("/v1/embeddings", json={"model": MEAN, "input": TEXTS[1]})
        assert again.status_code == 200, again.text
    with ollama.Client(host=live.url, timeout=120) as client:
        cut = client.embed(model=MEAN, input=long_text)
        assert cut.prompt_eval_count == 256 and len(cut.embeddings) == 1
        with pytest.raises(ollama.ResponseError) as refused:
            client.embed(model=MEAN, input=long_text, truncate=False)
        assert refused.value.status_code == 400 and "too large" in refused.value.error


def test_a_gguf_started_with_reranking_serves_rerank() -> None:
    """``pooling = "rank"`` (llama-server's ``--reranking``) adds ``MODEL:rerank``:
    ``/v1/rerank`` naming the model, or no model, scores every document through llama.cpp's
    rank pooling (SmolLM2 has no classifier head, so the scores rank nothing meaningful,
    as on llama-server: the shape, the order by score and ``top_n`` are what is checked);
    the model does not embed; a pair past the context is a 400; the model still chats."""
    entry = _model(MEAN, None)
    entry["embeddings"] = {"pooling": "rank", "n_ctx": 128, "memory_bytes": 150_000_000}
    config = Config.model_validate({
        "models": [entry], "server": {"default_model": MEAN},
        "workers": {"count": 1, "budget_bytes": 2_000_000_000}})
    server = start_server(config)
    docs = ["A cat sat on the mat.", "Paris is the capital of France.", "Cats purr."]
    try:
        with server.client(timeout=120) as http:
            for body in ({"query": "cats", "documents": docs},
                         {"model": MEAN, "query": "cats", "documents": docs}):
                r = http.post("/v1/rerank", json=body)
                assert r.status_code == 200, r.text
                results = r.json()["results"]
                assert sorted(x["index"] for x in results) == [0, 1, 2]
                scores = [x["relevance_score"] for x in results]
                assert scores == sorted(scores, reverse=True)
                assert all(np.isfinite(scores))
                assert r.json()["usage"]["prompt_tokens"] > 0
            top = http.post("/v1/rerank", json={"query": "cats", "documents": docs,
                                                "top_n": 2})
            assert [x["index"] for x in top.json()["results"]] == [
                x["index"] for x in results[:2]]
            listed = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
            assert listed[f"{MEAN}:rerank"]["task"] == "rerank"
            assert f"{MEAN}:embedding" not in listed
            assert_error(http.post("/v1/embeddings", json={"model": MEAN, "input": "x"}), 400,
                         code="model_kind_mismatch")
            long = http.post("/v1/rerank", json={"query": "cats",
                                                 "documents": ["word " * 400]})
            assert_error(long, 400, code="context_length_exceeded")
            ok = http.post("/v1/completions", json={"model": MEAN, "prompt": "Hello",
                                                    "max_tokens": 2})
            assert ok.status_code == 200, ok.text
    finally:
        server.stop()
