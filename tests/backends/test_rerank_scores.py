"""The reranking pieces below the HTTP route: the ranked order, the synthetic and the
bi-encoder scores, what a rerank model takes, and the config that declares one."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from sluice.backends.base import (
    BackendError,
    ModelLoadError,
    ModelSpec,
    RerankPair,
    RerankScore,
    rerank_pairs,
)
from sluice.backends.onnx import cosine_scores, model_files
from sluice.backends.packaged import MINILM_ENCODER_ID
from sluice.backends.synthetic.oneshot import word_overlap
from sluice.config import ModelConfig
from sluice.server.rerank_wire import ranked


def scores(*values: float) -> list[RerankScore]:
    return [RerankScore(v, 1, 1) for v in values]


def test_ranked_is_highest_first_ties_in_document_order_and_cut_to_top_n() -> None:
    s = scores(0.2, 0.9, 0.2, -1.0, 0.9)
    assert ranked(s, None) == [1, 4, 0, 2, 3]
    assert ranked(s, 0) == [1, 4, 0, 2, 3]
    assert ranked(s, 2) == [1, 4]
    assert ranked(s, 50) == [1, 4, 0, 2, 3]


def test_word_overlap_is_the_share_of_the_querys_words() -> None:
    assert word_overlap(RerankPair("capital of France", "Paris is the capital of France")) \
        == RerankScore(1.0, 3, 6)
    assert word_overlap(RerankPair("capital of France", "bananas")).score == 0.0
    assert word_overlap(RerankPair("the the cat", "The dog")).score == 0.5
    assert word_overlap(RerankPair("France?", "Paris, France.")) == RerankScore(1.0, 1, 2)
    assert word_overlap(RerankPair("", "anything")).score == 0.0


def test_cosine_scores_embed_each_distinct_text_once() -> None:
    calls: list[list[str]] = []
    table = {"q": [1.0, 0.0], "a": [0.6, 0.8], "b": [0.0, 1.0], "r": [1.0, 0.0]}

    def embed(texts: Sequence[str]) -> tuple[np.ndarray, list[int]]:
        calls.append(list(texts))
        return np.array([table[t] for t in texts]), [len(t) + 2 for t in texts]

    pairs = [RerankPair("q", "a"), RerankPair("q", "b"), RerankPair("r", "a"),
             RerankPair("q", "a")]
    out = cosine_scores(pairs, embed)
    assert calls == [["q", "a", "b", "r"]]
    assert [round(s.score, 6) for s in out] == [0.6, 0.0, 0.6, 0.6]
    assert out[0] == RerankScore(pytest.approx(0.6), 3, 3)


def test_a_rerank_model_takes_only_pairs() -> None:
    assert rerank_pairs([("q", "d")]) == [RerankPair("q", "d")]
    with pytest.raises(BackendError, match="pairs"):
        rerank_pairs(["just a text"])
    with pytest.raises(BackendError, match="pairs"):
        rerank_pairs([("q", 3)])


def spec(**options: object) -> ModelSpec:
    return ModelSpec("r", "oneshot", "onnx", 1, task="rerank", options=options)


def test_model_files_resolve_the_packaged_encoder_and_name_a_bad_option(
    tmp_path: Path,
) -> None:
    model, tokenizer = model_files(spec(path=f"packaged:{MINILM_ENCODER_ID}"))
    assert model.suffix == ".onnx" and model.is_file()
    assert tokenizer.name == "tokenizer.json" and tokenizer.is_file()
    with pytest.raises(ModelLoadError, match="no packaged encoder 'bge-reranker'"):
        model_files(spec(path="packaged:bge-reranker"))
    with pytest.raises(ModelLoadError, match=r"options\.tokenizer"):
        model_files(spec(path=str(model)))
    with pytest.raises(ModelLoadError, match=r"options\.path"):
        model_files(spec(path=str(tmp_path / "missing.onnx"), tokenizer=str(tokenizer)))


@pytest.mark.parametrize(("kind", "backend"), [("generative", "llamacpp"),
                                               ("oneshot", "llamacpp")])
def test_only_a_one_shot_onnx_or_synthetic_model_reranks(kind: str, backend: str) -> None:
    with pytest.raises(ValidationError, match="task: rerank"):
        ModelConfig.model_validate({"id": "r", "kind": kind, "backend": backend,
                                    "task": "rerank", "memory_bytes": 1,
                                    "options": {"path": "packaged:smollm2-135m-instruct"}})
    ModelConfig.model_validate({"id": "r", "kind": "oneshot", "backend": "synthetic",
                                "task": "rerank", "memory_bytes": 1})
