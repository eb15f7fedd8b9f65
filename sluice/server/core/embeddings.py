"""What every embedding surface (OpenAI ``/v1/embeddings``, Ollama ``/api/embed`` and
``/api/embeddings``, native ``/v1/infer``, gRPC ``Embed`` and ``Infer``) reads from an
embedding model's finals: the vectors, and the tokens the model read for them; and the
model inputs an ``input`` of texts, token ids or both stands for."""

from __future__ import annotations

from collections.abc import Sequence

from sluice.backends.base import Embedding, EmbedInput
from sluice.engine.request import Final
from sluice.server.schemas.embedding import EmbedValue, prompts


def embed_inputs(value: EmbedValue, *, truncate: bool = False) -> list[str | EmbedInput]:
    """The embedding model's inputs for an ``input``, one per prompt: a text stays a
    ``str`` (refused when longer than the model's context) unless ``truncate`` asks for
    it to be cut; ids become an ``EmbedInput``."""
    out: list[str | EmbedInput] = []
    for p in prompts(value):
        if isinstance(p, str) and not truncate:
            out.append(p)
        else:
            out.append(EmbedInput((p,) if isinstance(p, str) else tuple(p), truncate))
    return out


def embedded(finals: Sequence[Final]) -> tuple[list[list[float]], int]:
    """The vectors of ``finals`` in order, and the tokens the model read for all of them
    (the sum of each ``Embedding.n_tokens``: a request's ``prompt_tokens`` and
    ``total_tokens``). ``TypeError`` when a final's result is not an ``Embedding``."""
    results = [f.result for f in finals]
    for r in results:
        if not isinstance(r, Embedding):
            raise TypeError(f"an embedding model returned {type(r).__name__}, not Embedding")
    return [r.vector for r in results], sum(r.n_tokens for r in results)
