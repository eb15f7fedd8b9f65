"""What a GGUF recommends for sampling: its ``general.sampling.*`` metadata keys, read from
a loaded (vocab-only is enough) ``llama_model``, by the ``SamplingParams`` field each sets.
The request's own fields and the configuration's are applied over these by
``sluice.engine.sampling_defaults``."""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from typing import Any

GGUF_SAMPLING_KEYS: Mapping[str, str] = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_k": "top_k",
    "general.sampling.top_p": "top_p",
    "general.sampling.min_p": "min_p",
    "general.sampling.penalty_repeat": "repetition_penalty",
    "general.sampling.penalty_last_n": "penalty_last_n",
}
"""The keys (llama.cpp's ``LLM_KV_SAMPLING_*``) sluice reads, by the field each sets. Keys
of samplers sluice does not have (mirostat, XTC, the sampler sequence) are not read."""

_INTEGER_FIELDS = frozenset({"top_k", "penalty_last_n"})
_RANGES: Mapping[str, tuple[float, float]] = {
    "temperature": (0.0, 2.0), "top_k": (0, 100_000), "top_p": (1e-9, 1.0),
    "min_p": (0.0, 1.0), "repetition_penalty": (1e-9, 10.0), "penalty_last_n": (-1, 1_000_000),
}
"""What a request may send for each field (``sluice.server.schemas``); a file's value
outside it is ignored."""


def parse_sampling(values: Mapping[str, str]) -> dict[str, float | int]:
    """``values`` (GGUF key → the value as llama.cpp prints it) by field name; a value that
    does not parse, or lies outside what a request may send, is left out."""
    out: dict[str, float | int] = {}
    for key, name in GGUF_SAMPLING_KEYS.items():
        raw = values.get(key)
        if raw is None:
            continue
        try:
            value: float | int = int(raw) if name in _INTEGER_FIELDS else float(raw)
        except ValueError:
            continue
        lo, hi = _RANGES[name]
        if lo <= value <= hi:
            out[name] = value
    return out


def gguf_sampling(lib: Any, model: Any) -> dict[str, float | int]:
    """The sampling the GGUF of ``model`` recommends (``parse_sampling`` of its keys)."""
    values: dict[str, str] = {}
    buf = ctypes.create_string_buffer(128)
    for key in GGUF_SAMPLING_KEYS:
        if lib.llama_model_meta_val_str(model, key.encode(), buf, len(buf)) >= 0:
            values[key] = buf.value.decode("utf-8", "replace")
    return parse_sampling(values)
