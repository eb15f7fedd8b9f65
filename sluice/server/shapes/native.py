"""sluice's native ``/v1/infer`` result and stream chunks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sluice.backends.base import Embedding
from sluice.engine.request import Final, TokenEvent
from sluice.server.shapes.base import Shape, usage


class InferShape(Shape):
    """sluice's native ``/v1/infer`` result."""

    object_name = "sluice.inference"
    chunk_name = "sluice.inference.chunk"

    def delta(self, text: str, first: bool, choice: int = 0) -> dict[str, Any]:
        return {"id": self.id, "object": self.chunk_name, "model": self.model, "delta": text}

    def end(self, finish_reason: str, choice: int = 0) -> dict[str, Any]:
        return {"id": self.id, "object": self.chunk_name, "model": self.model, "delta": "",
                "finish_reason": finish_reason}

    def full(self, final: Final, events: Sequence[TokenEvent] = ()) -> dict[str, Any]:
        result = final.result
        output: Any = final.text if result is None else result
        prompt_tokens = final.prompt_tokens
        if isinstance(result, Embedding):  # the vector, and the tokens the model read
            output, prompt_tokens = result.vector, result.n_tokens
        return {
            "id": self.id,
            "object": self.object_name,
            "created": self.created,
            "model": self.model,
            "output": output,
            "finish_reason": final.finish_reason,
            "usage": usage(prompt_tokens, final.completion_tokens),
        }
