"""What every embedding surface (OpenAI ``/v1/embeddings``, Ollama ``/api/embed`` and
``/api/embeddings``, native ``/v1/infer``, gRPC ``Embed`` and ``Infer``) reads from an
embedding model's finals: the vectors, and the tokens the model read for them."""

from __future__ import annotations

from collections.abc import Sequence

from sluice.backends.base import Embedding
from sluice.engine.request import Final


def embedded(finals: Sequence[Final]) -> tuple[list[list[float]], int]:
    """The vectors of ``finals`` in order, and the tokens the model read for all of them
    (the sum of each ``Embedding.n_tokens``: a request's ``prompt_tokens`` and
    ``total_tokens``). ``TypeError`` when a final's result is not an ``Embedding``."""
    results = [f.result for f in finals]
    for r in results:
        if not isinstance(r, Embedding):
            raise TypeError(f"an embedding model returned {type(r).__name__}, not Embedding")
    return [r.vector for r in results], sum(r.n_tokens for r in results)
