"""llama-server's native request bodies (``/completion``, ``/infill``, ``/apply-template``)
and their translation into the serving core's terms.

- ``prompt``: a string, token ids, or a mix of both (each string tokenized where it stands,
  BOS first when the prompt starts with a string), or ``{"prompt_string": text}``; a list
  holding lists or such objects is several prompts (``MAX_PROMPTS`` at most), each run as
  a request of its own and answered as a list, as llama-server does;
- ``n_predict`` (also ``max_tokens``): left out, the model's ``default_max_tokens`` (else
  the server's); -1, until a stop or the end of the sequence's context; 0 is refused
  (sluice does not fill a cache without generating);
- the sampling fields llama.cpp's sampler chain shares with sluice's engine, and
  ``samplers``: which of them apply (one left out of the list is off, as in llama.cpp; the
  order is the engine's: penalties, top-k, top-p, min-p, temperature);
- ``n_probs``: each generated token's log-probability with that many alternatives; with
  ``post_sampling_probs``, its probability after the sampler chain (the distribution it
  was drawn from) with that many of the chain's kept candidates;
- ``cache_prompt`` and ``id_slot`` are accepted: prefix reuse and the slot are the engine's
  choice.

A field of a sampler sluice does not run (``mirostat``, ``typical_p``, ``dry_multiplier``,
``xtc_probability``, ...) is refused unless it has the value that turns that sampler off,
so no client silently gets other sampling than it asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import AliasChoices, Field, StrictBool, field_validator

from sluice.backends.base import FimTokens, Tokenizer
from sluice.server.core import MixedPrompt, TextPrompt, TokenPrompt
from sluice.server.errors import bad_param
from sluice.server.params import checked_bias, sent_sampling
from sluice.server.schemas.base import MAX_TOP_LOGPROBS, _Body
from sluice.server.schemas.messages import ChatMessage, ToolDef
from sluice.server.schemas.sampling import SamplingBody, TemplateKwargs

SAMPLER_ALIASES: Mapping[str, str] = {
    "top-k": "top_k", "topk": "top_k", "top-p": "top_p", "topp": "top_p", "nucleus": "top_p",
    "min-p": "min_p", "minp": "min_p", "temp": "temperature", "typ-p": "typ_p", "typp": "typ_p",
    "typ": "typ_p", "top-n-sigma": "top_n_sigma", "topnsigma": "top_n_sigma",
}
"""llama.cpp's other names for its samplers (``common_sampler_types_from_names``)."""
SAMPLER_CHARS: Mapping[str, str] = {
    "e": "penalties", "d": "dry", "s": "top_n_sigma", "k": "top_k", "y": "typ_p",
    "p": "top_p", "m": "min_p", "x": "xtc", "t": "temperature", "i": "infill",
    "a": "adaptive_p",
}
"""``samplers`` given as one string of llama.cpp's sampler letters."""
ENGINE_SAMPLERS = ("penalties", "top_k", "top_p", "min_p", "temperature")
"""The samplers sluice's engine runs, in its order."""
IDLE_SAMPLERS = ("dry", "top_n_sigma", "typ_p", "xtc")
"""llama.cpp samplers sluice does not run, accepted in ``samplers`` because with their
settings off (``SAMPLER_OFF``, enforced) they change nothing."""
DEFAULT_SAMPLERS = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p",
                    "xtc", "temperature")
"""llama-server's default ``samplers``."""
SAMPLER_OFF: Mapping[str, float] = {
    "typical_p": 1.0, "dry_multiplier": 0.0, "xtc_probability": 0.0, "dynatemp_range": 0.0,
    "mirostat": 0.0, "n_indent": 0.0, "t_max_predict_ms": 0.0,
}
"""Fields of features sluice does not run, and the value that turns each off (also
``top_n_sigma`` at or below 0, and ``adaptive_target`` below 0)."""
LLAMA_DEFAULT_SEED = 0xFFFFFFFF
"""llama.cpp's seed for "random": what ``generation_settings`` shows without a seed."""


def _canonical_samplers(value: list[str] | str) -> list[str]:
    names = ([SAMPLER_CHARS.get(c, c) for c in value] if isinstance(value, str)
             else [SAMPLER_ALIASES.get(n.lower(), n.lower()) for n in value])
    for name in names:
        if name not in ENGINE_SAMPLERS and name not in IDLE_SAMPLERS:
            raise ValueError(f"unknown or unsupported sampler {name[:40]!r}: sluice runs "
                             f"{', '.join(ENGINE_SAMPLERS)} (and accepts "
                             f"{', '.join(IDLE_SAMPLERS)}, which it does not run)")
    return names


MAX_PROMPTS = 64
"""The most prompts one ``/completion`` request may hold."""
PROMPT_STRING_KEY = "prompt_string"
"""llama-server's prompt object: ``{"prompt_string": text}`` (with ``multimodal_data`` for
a multimodal model, which sluice does not serve)."""
MAX_BIAS_TEXT_CHARS = 1024
"""The longest text key of ``logit_bias`` (each key's tokens get its bias)."""

OnePrompt = str | list[int | str] | dict[str, str]


def _one(v: Any) -> Any:
    """One prompt as ``prompt`` gives it (text, token ids and texts, or a prompt object),
    checked."""
    if isinstance(v, dict):
        if "multimodal_data" in v:
            raise ValueError("multimodal prompts are not supported: the served models are "
                             "text models")
        if set(v) != {PROMPT_STRING_KEY} or not isinstance(v[PROMPT_STRING_KEY], str):
            raise ValueError(f'a prompt object is {{"{PROMPT_STRING_KEY}": text}}')
    elif isinstance(v, list):
        if not v:
            raise ValueError("prompt must not be empty")
        if any(isinstance(p, bool) or not isinstance(p, int | str) for p in v):
            raise ValueError("prompt items must be token ids or strings")
    return v


def _as_prompt(p: OnePrompt) -> TextPrompt | TokenPrompt | MixedPrompt:
    if isinstance(p, dict):
        return TextPrompt(p[PROMPT_STRING_KEY])
    if isinstance(p, str):
        return TextPrompt(p)
    if all(isinstance(t, int) for t in p):
        return TokenPrompt([int(t) for t in p])
    return MixedPrompt(list(p), bos=isinstance(p[0], str))


class NativeCompletionRequest(SamplingBody):
    """``POST /completion`` (and ``/completions``): llama-server's own completion body."""

    prompt: str | dict[str, str] | list[int | str] | list[OnePrompt]
    max_tokens: int | None = Field(
        default=None, ge=-1, le=1_000_000,
        validation_alias=AliasChoices("n_predict", "max_tokens", "max_completion_tokens"))
    """``n_predict``: tokens at most; -1: until a stop or the end of the context."""
    n: Literal[1] = Field(default=1, validation_alias=AliasChoices("n_cmpl", "n"))
    """One completion per request (``n_cmpl`` > 1 answers an array in llama-server)."""
    n_probs: int = Field(default=0, ge=0, le=MAX_TOP_LOGPROBS)
    """Each token's log-probability with this many alternatives (0: none)."""
    post_sampling_probs: StrictBool = False
    """With ``n_probs``: probabilities after the sampler chain (``prob``, ``top_probs``)
    instead of the model's log-probabilities (``logprob``, ``top_logprobs``)."""
    return_tokens: StrictBool = False
    cache_prompt: StrictBool = True
    """Accepted: the engine reuses a retained prefix whenever one matches."""
    id_slot: int = Field(default=-1, ge=-1)
    """Accepted: the engine picks the slot."""
    samplers: list[str] | str | None = Field(default=None, max_length=64)
    timings_per_token: StrictBool = False
    """``timings`` in every streamed chunk, not only the last."""
    return_progress: StrictBool = False
    """A stream first carries ``prompt_progress`` chunks while the prompt is computed."""
    lora: list[Any] | None = Field(default=None, max_length=0)
    """No LoRA adapters are served: only an empty list."""

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompts(cls, v: Any) -> Any:
        if isinstance(v, list) and any(isinstance(p, list | dict) for p in v):
            if len(v) > MAX_PROMPTS:
                raise ValueError(f"at most {MAX_PROMPTS} prompts in one request")
            return [_one(p) for p in v]
        return _one(v)

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _llama_bias(cls, v: Any) -> Any:
        """llama-server's forms: ``[[token id or text, bias], ...]`` and ``false`` for a
        ban."""
        if isinstance(v, dict):
            return {k: _bias_value(b) for k, b in v.items()}
        if not isinstance(v, list):
            return v
        out: dict[str, Any] = {}
        for pair in v:
            if not (isinstance(pair, list) and len(pair) == 2):
                raise ValueError("logit_bias pairs must be [token id or text, bias]")
            token, bias = pair
            if not isinstance(token, int | str) or isinstance(token, bool):
                raise ValueError("logit_bias keys must be token ids or text")
            out[str(token)] = _bias_value(bias)
        return out

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        """A key is a token id (digits) or text, whose every token gets the bias, as
        llama-server reads them (the OpenAI routes take token ids only)."""
        for key, bias in (v or {}).items():
            if not key or len(key) > MAX_BIAS_TEXT_CHARS:
                raise ValueError(f"keys must be token ids or text of 1 to "
                                 f"{MAX_BIAS_TEXT_CHARS} characters; got {key[:20]!r}")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"biases must be in [-100, 100]; got {bias} for "
                                 f"{key[:20]!r}")
        return v

    def bias_pairs(self) -> tuple[tuple[int, float], ...]:
        """The token-id keys' (token id, bias) pairs (``text_bias``: the text keys)."""
        return tuple(sorted((int(k), float(b)) for k, b in (self.logit_bias or {}).items()
                            if k.isdigit()))

    def text_bias(self) -> list[tuple[str, float]]:
        """The text keys of ``logit_bias`` with their biases, in the order sent."""
        return [(k, float(b)) for k, b in (self.logit_bias or {}).items() if not k.isdigit()]

    @field_validator("samplers")
    @classmethod
    def _samplers(cls, v: list[str] | str | None) -> list[str] | None:
        return None if v is None else _canonical_samplers(v)

    @field_validator("seed")
    @classmethod
    def _random_seed(cls, v: int | None) -> int | None:
        return None if v == -1 else v  # llama.cpp's -1: a random seed

    def several(self) -> bool:
        """Whether ``prompt`` is several prompts (answered as a list)."""
        return isinstance(self.prompt, list) and any(isinstance(p, list | dict)
                                                     for p in self.prompt)

    def prompts_of(self) -> list[TextPrompt | TokenPrompt | MixedPrompt]:
        """The core's prompt for each of ``prompt``'s prompts (one unless ``several``)."""
        p = self.prompt
        if self.several():
            assert isinstance(p, list)
            return [_as_prompt(q) for q in p]  # type: ignore[arg-type]
        return [_as_prompt(p)]  # type: ignore[arg-type]

    def prompt_of(self) -> TextPrompt | TokenPrompt | MixedPrompt:
        """The core's prompt for a ``prompt`` that is one prompt."""
        return self.prompts_of()[0]

    def sampler_names(self) -> list[str]:
        return list(DEFAULT_SAMPLERS if self.samplers is None else self.samplers)


def _bias_value(bias: Any) -> Any:
    if bias is False:
        return -100.0  # llama-server's ban
    if isinstance(bias, bool):
        raise ValueError("a logit_bias value must be a number, or false to ban the token")
    return bias


class InfillExtra(_Body):
    """One chunk of extra context (another file of the project)."""

    text: str = Field(max_length=1_000_000)
    filename: str = Field(default="tmp", max_length=1024)


class InfillRequest(NativeCompletionRequest):
    """``POST /infill``: the code before and after the gap, extra context, and ``prompt``
    (text that continues the prefix); every ``/completion`` option."""

    prompt: str = Field(default="", max_length=1_000_000)
    input_prefix: str = Field(max_length=1_000_000)
    input_suffix: str = Field(max_length=1_000_000)
    input_extra: list[InfillExtra] = Field(default_factory=list, max_length=256)


class ApplyTemplateRequest(TemplateKwargs):
    """``POST /apply-template``: chat turns (as ``/v1/chat/completions`` takes them), and
    what the template sees besides: ``add_generation_prompt`` (default true) and
    ``chat_template_kwargs.enable_thinking`` (default: the model's)."""

    model: str | None = Field(default=None, min_length=1, max_length=256)
    messages: list[ChatMessage] = Field(min_length=1, max_length=1024)
    tools: list[ToolDef] | None = Field(default=None, max_length=128)
    add_generation_prompt: StrictBool = True


def refuse_idle_features(body: _Body) -> None:
    """400 naming the first field that would turn on a sampler or feature sluice does not
    run (``SAMPLER_OFF``)."""
    extra = body.model_extra or {}
    for name, off in SAMPLER_OFF.items():
        if name in extra and extra[name] is not None and not _is(extra[name], off):
            raise _unsupported(name, f"give {off:g} or leave it out")
    sigma = extra.get("top_n_sigma")
    if sigma is not None and not _at_most(sigma, 0.0):
        raise _unsupported("top_n_sigma", "give -1 or leave it out")
    target = extra.get("adaptive_target")
    if target is not None and not _at_most(target, -1e-9):
        raise _unsupported("adaptive_target", "give -1 or leave it out")


def _is(value: Any, off: float) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == off


def _at_most(value: Any, limit: float) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value <= limit


def _unsupported(name: str, fix: str) -> Exception:
    return bad_param(name, f"'{name}' is not supported: sluice's sampler chain is "
                           f"{', '.join(ENGINE_SAMPLERS)} ({fix})")


def native_sampling(body: NativeCompletionRequest, tok: Tokenizer) -> dict[str, Any]:
    """``SamplingParams`` fields (all but ``max_tokens`` and the constraint): the sampling
    controls the client sent, each sampler left out of ``samplers`` turned off."""
    refuse_idle_features(body)
    kwargs: dict[str, Any] = {
        **sent_sampling(body),
        "seed": None if body.seed is None else body.seed % 2**64,
        "stop": body.stop_list(),
        "ignore_eos": body.ignore_eos,
        "logit_bias": _native_bias(body, tok),
    }
    if body.n_probs:
        kwargs.update(logprobs=True, top_logprobs=body.n_probs,
                      post_sampling_probs=body.post_sampling_probs)
    chosen = set(body.sampler_names())
    off: dict[str, Any] = {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "temperature": 1.0}
    kwargs.update({k: v for k, v in off.items() if k not in chosen})
    if "penalties" not in chosen:
        kwargs.update(repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0)
    return kwargs


def _native_bias(body: NativeCompletionRequest, tok: Tokenizer) -> tuple[tuple[int, float], ...]:
    """``logit_bias`` as (token id, bias) pairs: the ids checked against the vocabulary, and
    each text key's tokens (as plain text, no BOS) with its bias, as llama-server biases
    them; a token in a text key takes that key's bias over its id's (the last key's, where
    several name it)."""
    merged = dict(checked_bias(body, tok))
    for text, bias in body.text_bias():
        for token in tok.tokenize(text, add_bos=False, special=False):
            merged[token] = bias
    return tuple(sorted(merged.items()))


FIM_SNIPPET_SEPARATOR = "\n\n--- snippet ---\n\n"
"""What separates extra context chunks for a model without a file-separator token."""


def infill_pieces(fim: FimTokens, body: InfillRequest) -> list[int | str]:
    """llama-server's infill prompt (repo-level pattern when the model has the repository
    and file-separator tokens): the extra context, then ``FIM_PRE prefix prompt FIM_SUF
    suffix FIM_MID``. Nothing is cut: a prompt past the context is refused as on every
    surface."""
    pieces: list[int | str] = []
    if fim.repo is not None:
        pieces += [fim.repo, "myproject\n"]
    for chunk in body.input_extra:
        if fim.file_sep is not None:
            pieces += [fim.file_sep, chunk.filename + "\n"]
        else:
            pieces.append(FIM_SNIPPET_SEPARATOR)
        pieces.append(chunk.text)
    if fim.file_sep is not None:
        pieces += [fim.file_sep, "filename\n"]
    pieces += [fim.prefix, body.input_prefix, body.prompt, fim.suffix, body.input_suffix,
               fim.middle]
    return [p for p in pieces if p != ""]
