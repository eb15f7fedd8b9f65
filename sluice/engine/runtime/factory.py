"""Requests before submission: a fresh id, the model's default deadlines, the sampling a
request gets for the fields it leaves out, and the cached tokenizer of each generative
model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sluice.backends.base import Tokenizer
from sluice.engine.request import Request, SamplingParams
from sluice.engine.runtime.state import RuntimeState
from sluice.engine.sampling_defaults import SamplingDefaults, resolve_defaults
from sluice.policy.capacity.keep_alive import KeepAlive


class RequestFactory(RuntimeState):
    """``new_request``, ``sampling_params`` and the tokenizer cache (``_tokenizers``, filled
    once per model under ``_cv``; a tokenizer is loaded outside it)."""

    def tokenizer(self, model_id: str) -> Tokenizer:
        """The (cached) tokenizer of a generative model; loads only its vocabulary."""
        with self._cv:
            tok = self._tokenizers.get(model_id)
        if tok is None:
            spec = self.specs[model_id]
            tok = self._backends[spec.backend].load_tokenizer(spec)
            with self._cv:
                tok = self._tokenizers.setdefault(model_id, tok)
        return tok

    def sampling_defaults(self, model_id: str) -> SamplingDefaults:
        """The sampling a request to ``model_id`` gets for the fields it leaves out: the
        model file's, else the configuration's, else llama-server's
        (``sluice.engine.sampling_defaults``). Loads the model's tokenizer if need be."""
        spec = self.specs[model_id]
        return resolve_defaults(self.tokenizer(model_id).model_sampling, spec.sampling,
                                config_first=spec.sampling_over_model)

    def sampling_params(self, model_id: str, **sent: Any) -> SamplingParams:
        """A request's ``SamplingParams``: the fields it sent (every API passes only those
        its client gave) over ``sampling_defaults``. ``penalty_last_n`` -1 is the whole
        context of one sequence; a ``seed`` sent as ``None`` is not sent."""
        tok = self.tokenizer(model_id)
        given = {k: v for k, v in sent.items() if not (k == "seed" and v is None)}
        fields = {**self.sampling_defaults(model_id).values, **given}
        if fields["penalty_last_n"] == -1:
            fields["penalty_last_n"] = tok.n_ctx_per_seq
        return SamplingParams(**fields)

    def new_request_id(self) -> int:
        """A request id no other request has (one refused before it had a model gets one,
        so every refusal is told apart in logs and decisions)."""
        return next(self._ids)

    def new_request(
        self,
        model_id: str,
        *,
        prompt_tokens: Sequence[int] = (),
        input: Any = None,
        params: SamplingParams | None = None,
        tenant_id: str = "default",
        priority: int = 5,
        deadline_s: float | None = None,
        ttft_deadline_s: float | None = None,
        ttft_target_s: float | None = None,
        keep_alive: KeepAlive | None = None,
    ) -> Request:
        """A request with a fresh id, not yet submitted (attach listeners, then submit).
        ``model_id`` may name a model group: the planner picks the variant at submission.
        A generative request without a first-token deadline gets its model's default
        (``ModelSpec.ttft_deadline_s`` after arrival), if it has one; so for the first-token
        target (``ModelSpec.ttft_target_s``)."""
        spec = self.spec_for(model_id)
        if spec is None:
            raise KeyError(model_id)
        now = self.clock()
        if ttft_deadline_s is None and spec.ttft_deadline_s is not None:
            ttft_deadline_s = now + spec.ttft_deadline_s
        if ttft_target_s is None and spec.ttft_target_s is not None:
            ttft_target_s = now + spec.ttft_target_s
        return Request(
            request_id=next(self._ids),
            model_id=model_id,
            kind=spec.kind,
            arrival_s=now,
            prompt_tokens=tuple(prompt_tokens),
            input=input,
            params=params or SamplingParams(),
            tenant_id=tenant_id,
            priority=priority,
            deadline_s=deadline_s,
            ttft_deadline_s=ttft_deadline_s if spec.kind == "generative" else None,
            ttft_target_s=ttft_target_s if spec.kind == "generative" else None,
            keep_alive=keep_alive,
        )
