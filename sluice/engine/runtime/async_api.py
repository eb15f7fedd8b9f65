"""The Python API on asyncio: a request submitted with an ``AsyncHandle`` attached
(``sluice.engine.bridge``), and ``generate`` / ``infer`` for a prompt or one input."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from sluice.engine.bridge import AsyncHandle
from sluice.engine.request import Final, Request
from sluice.engine.runtime.admission import Admission
from sluice.engine.runtime.factory import RequestFactory
from sluice.policy.queues.admission import Rejection


class Rejected(Exception):
    """Raised by the async API when admission refuses a request."""

    def __init__(self, rejection: Rejection) -> None:
        super().__init__(rejection.message)
        self.rejection = rejection


class AsyncAPI(RequestFactory, Admission):
    """``open`` / ``open_unit`` submit without waiting and raise ``Rejected`` when
    admission refuses; the handles stream the requests' events on the running loop."""

    def open(self, req: Request) -> AsyncHandle:
        """Attach an asyncio event stream to ``req`` and submit it without waiting.
        Raises ``Rejected`` if admission refuses it."""
        handle = AsyncHandle(self, req, asyncio.get_running_loop())
        rejection = self.try_submit(req)
        if rejection is not None:
            raise Rejected(rejection)
        return handle

    def open_unit(self, reqs: Sequence[Request]) -> list[AsyncHandle]:
        """``open`` for the inputs of one API request, admitted as one unit
        (``try_submit_unit``). Raises ``Rejected`` if admission refuses them (all end
        ``REJECTED``)."""
        loop = asyncio.get_running_loop()
        handles = [AsyncHandle(self, req, loop) for req in reqs]
        rejection = self.try_submit_unit(reqs)
        if rejection is not None:
            raise Rejected(rejection)
        return handles

    async def generate(
        self, model_id: str, prompt: str, *, add_bos: bool = True, **params: Any
    ) -> AsyncHandle:
        """Tokenize ``prompt`` and submit a generative request (``params``: the
        ``SamplingParams`` fields to set, the model's defaults for the others); iterate the
        handle's ``tokens()`` or await ``result()``."""
        tokens = self.tokenizer(model_id).tokenize(prompt, add_bos=add_bos)
        req = self.new_request(model_id, prompt_tokens=tokens,
                               params=self.sampling_params(model_id, **params))
        return self.open(req)

    async def infer(self, model_id: str, input: Any) -> Final:
        """Run one one-shot input (e.g. a text to embed) and return its terminal event."""
        return await self.open(self.new_request(model_id, input=input)).result()
