"""Synthetic one-shot models: embeddings (counted in ``SyntheticTokenizer`` tokens, BOS
included) and classification scores from a hash, rerank scores by word overlap."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from sluice.backends.base import (
    Embedding,
    EmbedInput,
    ModelSpec,
    OneShotModel,
    RerankPair,
    RerankScore,
    embed_input,
    rerank_pairs,
)
from sluice.backends.synthetic.cost import CostModel, digest, sleep
from sluice.backends.synthetic.tokenizer import SyntheticTokenizer

_WORD = re.compile(r"\w+")


def word_overlap(pair: RerankPair) -> RerankScore:
    """The synthetic rerank score: the share of the query's distinct lowercase words
    (``\\w+`` runs, so punctuation does not count) that the document holds, in [0, 1];
    tokens: those words."""
    query, document = _WORD.findall(pair.query.lower()), _WORD.findall(pair.document.lower())
    wanted = set(query)
    score = len(wanted & set(document)) / len(wanted) if wanted else 0.0
    return RerankScore(score, len(query), len(document))


class SyntheticOneShot(OneShotModel):
    """Embeddings (unit vectors of ``dim``, with the ``SyntheticTokenizer`` tokens of the
    input as llama-server counts them: BOS and the words) or classification scores, from a
    hash; rerank scores by ``word_overlap``."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self._cost = CostModel(spec)
        self.dim = int(spec.options.get("dim", 8))
        self.tokenizer = SyntheticTokenizer(spec)
        labels = spec.options.get("labels", ("negative", "positive"))
        self.labels: tuple[str, ...] = tuple(labels)
        self.batch_sizes: list[int] = []
        self.closed = False

    def run_batch(self, inputs: Sequence[Any]) -> list[Any]:
        self._cost.next_call("run_batch")
        self.batch_sizes.append(len(inputs))
        fixed = self._cost.option_s(self.spec, "batch_fixed_s", 0.002)
        per_item = self._cost.option_s(self.spec, "per_item_s", 0.001)
        sleep(fixed + per_item * len(inputs))
        if self.spec.task == "rerank":
            return [word_overlap(p) for p in rerank_pairs(inputs)]
        return [self._one(x) for x in inputs]

    def _one(self, x: Any) -> Any:
        key = x
        if isinstance(x, EmbedInput):  # a text-only input embeds as its text does
            key = x.pieces if x.text is None else x.text
        raw = np.frombuffer(digest(self.spec.model_id, key) * 4, dtype=np.uint8)[: self.dim]
        vec = raw.astype(np.float32) - 127.5
        vec /= float(np.linalg.norm(vec)) or 1.0
        if self.spec.task == "classification":
            scores = np.exp(vec[: len(self.labels)])
            probs = scores / scores.sum()
            return {lab: float(p) for lab, p in zip(self.labels, probs, strict=True)}
        return Embedding(vec.tolist(), self._n_tokens(x))

    def _n_tokens(self, x: Any) -> int:
        """Tokens an input reads: its texts' (BOS before a leading one) and its ids."""
        item = embed_input(x)
        n = 0
        for piece in item.pieces:
            n += (len(self.tokenizer.tokenize(piece, add_bos=n == 0))
                  if isinstance(piece, str) else 1)
        return n

    def close(self) -> None:
        self.closed = True
