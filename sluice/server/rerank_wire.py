"""The rerank wire format (``/v1/rerank``, ``/rerank``, ``/v1/reranking``, ``/reranking``):
the request body and the ranked response, in the shape llama-server, vLLM, Jina and Cohere
share, and in Hugging Face TEI's when the body holds ``texts`` (as llama-server answers it).

- ``documents``: strings, or Jina's objects ``{"text": ...}`` (TEI: ``texts``, strings);
- ``top_n``: the best that many; left out, 0 (vLLM's "all") or more than the documents:
  every document;
- ``return_documents`` (TEI: ``return_text``): each result carries its document,
  ``{"text": ...}`` (TEI: ``text``); off by default, as in llama-server and Cohere.

Results are sorted by score, highest first; equal scores keep the documents' order.
``usage`` counts the tokens the reranker ran: the query once, and every document.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import Field, StrictBool

from sluice.backends.base import RerankScore
from sluice.server.errors import bad_param
from sluice.server.schemas.base import DeadlineMs, Priority, _Body

MAX_TEXT_CHARS = 100_000
"""The longest query or document, in characters (as an embedding input)."""


class RerankDocument(_Body):
    """Jina's document object (only its ``text`` is read)."""

    text: str = Field(max_length=MAX_TEXT_CHARS)


class RerankRequest(_Body):
    """A query and the documents to rank against it."""

    model: str | None = Field(default=None, min_length=1, max_length=256)
    query: str = Field(max_length=MAX_TEXT_CHARS)
    documents: list[str | RerankDocument] | None = None
    texts: list[str] | None = None
    """TEI's name for the documents: the response is TEI's bare list."""
    top_n: int | None = Field(default=None, ge=0)
    return_documents: StrictBool = False
    return_text: StrictBool = False
    """TEI's ``return_documents``."""
    priority: Priority | None = None
    deadline_ms: DeadlineMs | None = None

    @property
    def tei(self) -> bool:
        """The body is TEI's (``texts``): so is the response."""
        return self.texts is not None

    def document_texts(self, max_documents: int) -> list[str]:
        """The documents' texts, in order: 400 naming the field when there are none, more
        than ``max_documents`` (``server.rerank_max_documents``), one is too long, or both
        ``documents`` and ``texts`` are given."""
        if self.documents is not None and self.texts is not None:
            raise bad_param("texts", "give 'documents' or 'texts' (TEI's name), not both")
        param = "texts" if self.tei else "documents"
        items = self.texts if self.texts is not None else self.documents or []
        if not items:
            raise bad_param(param, f"'{param}' must be a non-empty array of strings")
        if len(items) > max_documents:
            raise bad_param(param, f"'{param}' holds {len(items)} documents; this server "
                                   f"ranks at most {max_documents} per request")
        texts = [d if isinstance(d, str) else d.text for d in items]
        for i, text in enumerate(texts):
            if len(text) > MAX_TEXT_CHARS:
                raise bad_param(f"{param}.{i}", f"each document must be at most "
                                                f"{MAX_TEXT_CHARS} characters")
        return texts


def ranked(scores: Sequence[RerankScore], top_n: int | None) -> list[int]:
    """Document indices, highest score first (equal scores in document order), cut to
    ``top_n`` (None or 0: all)."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i].score)
    return order[:top_n] if top_n else order


def rerank_body(body: RerankRequest, model: str, request_id: int, documents: Sequence[str],
                scores: Sequence[RerankScore]) -> dict[str, Any] | list[dict[str, Any]]:
    """The response to ``body``: Jina/Cohere's ``{"id", "model", "object", "results",
    "usage"}``, or TEI's bare list of ``{"index", "score"}``."""
    order = ranked(scores, body.top_n)
    if body.tei:
        return [{"index": i, "score": scores[i].score,
                 **({"text": documents[i]} if body.return_text else {})} for i in order]
    n_tokens = scores[0].query_tokens + sum(s.document_tokens for s in scores)
    return {
        "id": f"rerank-{request_id}",
        "model": model,
        "object": "list",
        "results": [{"index": i, "relevance_score": scores[i].score,
                     **({"document": {"text": documents[i]}} if body.return_documents
                        else {})} for i in order],
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    }


__all__ = ["MAX_TEXT_CHARS", "RerankDocument", "RerankRequest", "ranked", "rerank_body"]
