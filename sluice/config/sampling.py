"""The bounds of each sampling control, stated once: a model's defaults (``[models.sampling]``)
and a request's fields (chat, completions, llama-server's ``/completion``) take the same
ranges, so a value a request may send is one a model may default to and back."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

Temperature = Annotated[float, Field(ge=0.0, le=2.0)]
"""0 is greedy."""
TopK = Annotated[int, Field(ge=0, le=100_000)]
"""0 = no top-k cut."""
TopP = Annotated[float, Field(gt=0.0, le=1.0)]
MinP = Annotated[float, Field(ge=0.0, le=1.0)]
RepetitionPenalty = Annotated[float, Field(gt=0.0, le=10.0)]
"""llama.cpp's repeat penalty (vLLM: ``repetition_penalty``); 1 is off."""
PenaltyLastN = Annotated[int, Field(ge=-1, le=1_000_000)]
"""Recent tokens the penalties look at; -1 = the whole context, 0 = none."""
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
"""A presence or frequency penalty (OpenAI's range)."""
