"""llama-server's native response bodies: the ``/completion`` (and ``/infill``) result and
stream chunks, its ``timings`` object, ``generation_settings`` and
``completion_probabilities`` (each token's ``logprob`` and ``top_logprobs``, or with
``post_sampling_probs`` its ``prob`` and ``top_probs``: the sampler chain's distribution).

A stream is one ``data: {...}`` chunk per generated token (``content``: the text that
became safe to show, ``tokens``: its id, ``stop: false``), then one last chunk with
``stop: true`` and the whole result but ``content`` (text held back to the end, if any) and
``tokens`` (none); with ``return_progress``, chunks with ``prompt_progress`` and no text
come first, while the prompt is computed; no ``[DONE]``, and an error mid-stream is
``data: {"error": {...}}`` in llama-server's error shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sluice.backends.base import Tokenizer
from sluice.engine.request import (
    Final,
    PromptProgress,
    Request,
    SamplingParams,
    TokenEvent,
    TokenLogprob,
)
from sluice.server.errors import APIError, llama_server_error
from sluice.server.llama_wire import LLAMA_DEFAULT_SEED
from sluice.server.shapes.base import LOGPROB_FLOOR, Shape
from sluice.server.shapes.timings import progress_object, progress_timings, timings

UNUSED_SAMPLER_SETTINGS: dict[str, Any] = {
    "dynatemp_range": 0.0, "dynatemp_exponent": 1.0, "top_n_sigma": -1.0,
    "xtc_probability": 0.0, "xtc_threshold": 0.1, "typical_p": 1.0, "dry_multiplier": 0.0,
    "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": -1, "mirostat": 0,
    "mirostat_tau": 5.0, "mirostat_eta": 0.1, "adaptive_target": -1.0, "adaptive_decay": 0.9,
    "n_keep": 0, "n_discard": 0, "min_keep": 0,
}
"""llama-server's settings of the samplers and features sluice does not run, at the values
that leave them off (the only ones ``llama_wire`` accepts)."""


def generation_settings(params: SamplingParams, *, n_predict: int, stream: bool,
                        samplers: Sequence[str], timings_per_token: bool = False,
                        ) -> dict[str, Any]:
    """llama-server's ``generation_settings``: the sampling a request ran with (or, for
    ``/props``, gets by default)."""
    return {
        "n_predict": n_predict, "max_tokens": n_predict,
        "seed": LLAMA_DEFAULT_SEED if params.seed is None else params.seed,
        "temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p,
        "min_p": params.min_p, "repeat_last_n": params.penalty_last_n,
        "repeat_penalty": params.repetition_penalty,
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
        **UNUSED_SAMPLER_SETTINGS,
        "stop": list(params.stop), "ignore_eos": params.ignore_eos, "stream": stream,
        "n_probs": params.top_logprobs if params.logprobs else 0,
        "samplers": list(samplers), "timings_per_token": timings_per_token,
        "post_sampling_probs": params.post_sampling_probs, "lora": [],
    }


def stop_type(final: Final) -> str:
    """``word`` (a stop string), ``limit`` (``n_predict`` or the context) or ``eos``."""
    if final.stop_sequence is not None:
        return "word"
    return "limit" if final.finish_reason == "length" else "eos"


class NativeShape(Shape):
    """The ``/completion`` result of one admitted request (see the module docstring)."""

    def __init__(self, req: Request, tok: Tokenizer, model: str, *, stream: bool,
                 return_tokens: bool, samplers: Sequence[str],
                 timings_per_token: bool = False) -> None:
        super().__init__(str(req.request_id), model)
        self.req = req
        self.tok = tok
        self.stream = stream
        self.return_tokens = return_tokens
        self.samplers = list(samplers)
        self.timings_per_token = timings_per_token
        self.n_probs = req.params.top_logprobs if req.params.logprobs else 0
        self._n_predicted = 0
        self._tail = ""
        """Text the engine flushed at the end (held back for a stop string): the last
        chunk carries it."""

    done_marker = None

    def error_chunk(self, err: APIError) -> dict[str, Any]:
        return llama_server_error(err)

    def _counts(self) -> dict[str, Any]:
        return {"index": 0, "id_slot": -1, "tokens_predicted": self._n_predicted,
                "tokens_evaluated": len(self.req.prompt_tokens)}

    def on_token(self, event: TokenEvent) -> list[dict[str, Any]]:
        if event.token_id < 0:
            self._tail += event.text
            return []
        self._n_predicted += 1
        chunk: dict[str, Any] = {"content": event.text, "tokens": [event.token_id],
                                 "stop": False, **self._counts()}
        if self.timings_per_token:
            chunk["timings"] = timings(self.req, self._n_predicted, event.time_s)
        if self.n_probs and _has_probs(event):
            chunk["completion_probabilities"] = [self._probs(event)]
        return [chunk]

    def on_progress(self, progress: PromptProgress) -> list[dict[str, Any]]:
        """llama-server's progress chunk: no text yet, ``prompt_progress`` (and ``timings``
        with ``timings_per_token``)."""
        chunk: dict[str, Any] = {"content": "", "tokens": [], "stop": False, **self._counts(),
                                 "prompt_progress": progress_object(progress, self.req)}
        if self.timings_per_token:
            chunk["timings"] = progress_timings(self.req, progress)
        return [chunk]

    def on_final(self, final: Final) -> list[dict[str, Any]]:
        return [self._result(final, content=self._tail, tokens=[])]

    def full(self, final: Final, events: Sequence[TokenEvent] = ()) -> dict[str, Any]:
        ids = [e.token_id for e in events if e.token_id >= 0]
        body = self._result(final, content=final.text,
                            tokens=ids if self.return_tokens else [])
        if self.n_probs:
            body["completion_probabilities"] = [self._probs(e) for e in events
                                                if e.token_id >= 0 and _has_probs(e)]
        return body

    def _result(self, final: Final, *, content: str, tokens: list[int]) -> dict[str, Any]:
        n = final.completion_tokens
        self._n_predicted = n
        prompt = b"".join(self.tok.token_bytes(t) for t in self.req.prompt_tokens)
        params = self.req.params
        return {
            "content": content, "tokens": tokens, "stop": True, "model": self.model,
            **self._counts(),
            "generation_settings": generation_settings(
                params, n_predict=params.max_tokens, stream=self.stream,
                samplers=self.samplers, timings_per_token=self.timings_per_token),
            "prompt": prompt.decode("utf-8", "replace"),
            "has_new_line": "\n" in final.text,
            "truncated": (final.finish_reason == "length"
                          and len(self.req.prompt_tokens) + n >= self.tok.n_ctx_per_seq),
            "stop_type": stop_type(final),
            "stopping_word": final.stop_sequence or "",
            "tokens_cached": len(self.req.prompt_tokens) + n,
            "timings": timings(self.req, n, self.req.times.finished_s or 0.0),
        }

    def _probs(self, event: TokenEvent) -> dict[str, Any]:
        if event.prob is not None:
            return {**self._piece(event.token_id), "prob": event.prob,
                    "top_probs": [{**self._piece(t.token_id), "prob": t.prob}
                                  for t in event.top_probs]}
        return {**self._alt(TokenLogprob(event.token_id, event.logprob or 0.0)),
                "top_logprobs": [self._alt(t) for t in event.top_logprobs]}

    def _alt(self, lp: TokenLogprob) -> dict[str, Any]:
        value = lp.logprob if lp.logprob > LOGPROB_FLOOR else LOGPROB_FLOOR
        return {**self._piece(lp.token_id), "logprob": value}

    def _piece(self, token_id: int) -> dict[str, Any]:
        raw = self.tok.token_bytes(token_id)
        return {"id": token_id, "token": raw.decode("utf-8", "ignore"), "bytes": list(raw)}


def _has_probs(event: TokenEvent) -> bool:
    """Whether the engine reported probabilities for this token (a forced token, such as
    a thinking budget's end tag, has none)."""
    return event.logprob is not None or event.prob is not None
