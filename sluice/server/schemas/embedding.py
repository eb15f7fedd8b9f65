"""The ``input`` of an embedding request, as OpenAI and llama-server take it, and the
prompts it holds."""

from __future__ import annotations

EmbedPrompt = str | list[str | int]
"""One prompt of an embedding request: a text, token ids, or ids and texts in order."""

EmbedValue = str | list[str] | list[str | int | list[str | int]]
"""An embedding request's ``input``: a text, a list of prompts, or one prompt of ids
(OpenAI's ``list[int]``; llama-server's mixed ``list[int | str]``)."""


def prompts(value: EmbedValue) -> list[EmbedPrompt]:
    """The prompts of an ``input``: a top-level list holding any token id is one prompt
    (llama-server's rule), any other list is one prompt per item."""
    if isinstance(value, str):
        return [value]
    if any(isinstance(x, int) for x in value):
        return [[x for x in value if isinstance(x, (str, int))]]
    return [x for x in value if isinstance(x, (str, list))]
