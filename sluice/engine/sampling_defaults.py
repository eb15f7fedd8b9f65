"""The sampling a generative request gets for the fields it leaves out.

Each field resolves on its own, first match wins: the field as the request sent it; the
model file's recommendation (a GGUF's ``general.sampling.*`` keys, read by its tokenizer:
``Tokenizer.model_sampling``); the model's ``[models.sampling]`` table in the TOML (before
the file's when its ``over_model_file`` is set, as ``sluice serve --temp`` does: a flag
wins over the file in llama-server too); llama-server's defaults. A ``seed`` comes from the
table alone (no default: each request seeds with its own id).
Every API (OpenAI, native ``/v1/infer``, gRPC, ``sluice chat``) builds its
``SamplingParams`` through ``Runtime.sampling_params``, which applies this, so a request
samples the same whichever way it came; ``/v1/models`` shows the values in force.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

DEFAULTED_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty",
                    "penalty_last_n", "presence_penalty", "frequency_penalty")
"""The ``SamplingParams`` fields a request may leave to the model."""

LLAMA_SERVER_DEFAULTS: Mapping[str, float | int] = {
    "temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05,
    "repetition_penalty": 1.0, "penalty_last_n": 64,
    "presence_penalty": 0.0, "frequency_penalty": 0.0,
}
"""llama-server's own defaults (``common_params_sampling``): what a request gets when
neither the model file nor the configuration says otherwise."""

Source = Literal["model", "config", "llama-server"]


@dataclass(frozen=True, slots=True)
class SamplingDefaults:
    """The value in force for every field of ``DEFAULTED_FIELDS``, and where it came from."""

    values: Mapping[str, float | int]
    sources: Mapping[str, Source]


def resolve_defaults(model: Mapping[str, float | int], config: Mapping[str, float | int],
                     config_first: bool = False) -> SamplingDefaults:
    """Each field from the model file (``model``), else the configuration (``config``),
    else llama-server's defaults; ``config_first``: the configuration before the file.
    ``seed`` is taken from the configuration when it has one; other keys outside
    ``DEFAULTED_FIELDS`` are ignored."""
    values: dict[str, float | int] = {}
    sources: dict[str, Source] = {}
    first: tuple[tuple[Mapping[str, float | int], Source], ...] = (
        ((config, "config"), (model, "model")) if config_first
        else ((model, "model"), (config, "config")))
    for name in DEFAULTED_FIELDS:
        found = next(((table[name], source) for table, source in first if name in table),
                     (LLAMA_SERVER_DEFAULTS[name], "llama-server"))
        values[name], sources[name] = found
    if "seed" in config:
        values["seed"], sources["seed"] = config["seed"], "config"
    return SamplingDefaults(values, sources)
