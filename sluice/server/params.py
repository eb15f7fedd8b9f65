"""From an OpenAI request body to the engine's ``SamplingParams``: sampling controls checked
against the model (token ids of ``logit_bias``, ``n`` against its sequence slots),
``response_format`` and required tool calls as a ``Constraint`` compiled before admission
(a schema the engine cannot compile is a 400 naming the field), and the tool plan."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sluice.backends.base import Tokenizer
from sluice.backends.chat import call_schema
from sluice.engine.constraints import (
    ConstraintError,
    ConstraintLimitError,
    ConstraintLimits,
    check_constraint,
)
from sluice.engine.request import Constraint
from sluice.engine.sampling_defaults import DEFAULTED_FIELDS
from sluice.server.errors import bad_param, public_text
from sluice.server.schemas.messages import NamedToolChoice, ResponseFormat
from sluice.server.schemas.openai import ChatCompletionRequest, CompletionRequest
from sluice.server.schemas.sampling import SamplingBody


def sent_sampling(body: Any) -> dict[str, Any]:
    """The fields of ``DEFAULTED_FIELDS`` the client set (left out or ``null``: the model's
    default, ``Runtime.sampling_params``); any API's body, whichever of them it has."""
    return {k: v for k in DEFAULTED_FIELDS if (v := getattr(body, k, None)) is not None}


def checked_bias(body: SamplingBody, tok: Tokenizer) -> tuple[tuple[int, float], ...]:
    """``logit_bias`` as (token id, bias) pairs, each id checked against the vocabulary."""
    bias = body.bias_pairs()
    bad = [t for t, _ in bias if t >= tok.vocab_size]
    if bad:
        raise bad_param("logit_bias", f"logit_bias keys must be token ids in "
                                      f"[0, {tok.vocab_size}); got {bad[0]}")
    return bias


def sampling_kwargs(body: ChatCompletionRequest | CompletionRequest,
                    tok: Tokenizer) -> dict[str, Any]:
    """``SamplingParams`` fields (all but ``max_tokens`` and the constraint); of the
    sampling controls only those the client sent."""
    bias = checked_bias(body, tok)
    if body.n > tok.n_seq_max:
        raise bad_param("n", f"n must be at most {tok.n_seq_max}, the sequences this model "
                             f"runs at once; got {body.n}")
    kwargs: dict[str, Any] = {
        **sent_sampling(body),
        # Any integer is a seed; numpy's generators take 0 .. 2**64-1 only.
        "seed": None if body.seed is None else body.seed % 2**64,
        "stop": body.stop_list(),
        "ignore_eos": body.ignore_eos,
        "speculation": body.speculation is not False,
        "logit_bias": bias,
        "n": body.n,
    }
    if isinstance(body, ChatCompletionRequest):
        kwargs["logprobs"] = bool(body.logprobs)
        kwargs["top_logprobs"] = body.top_logprobs or 0
    elif body.logprobs is not None:
        kwargs["logprobs"] = True
        kwargs["top_logprobs"] = body.logprobs
        kwargs["prompt_logprobs"] = body.echo
    return kwargs


def format_constraint(fmt: ResponseFormat | None) -> Constraint | None:
    """``response_format`` as a decoding constraint (``text`` is none)."""
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object" and fmt.schema_ is None:
        return Constraint("json_object")
    if fmt.type == "json_object":  # llama-server's json_object with a schema
        return Constraint("json_schema", spec=json.dumps(fmt.schema_))
    assert fmt.json_schema is not None
    return Constraint("json_schema", spec=json.dumps(fmt.json_schema.schema_),
                      strict=bool(fmt.json_schema.strict))


def body_constraint(body: SamplingBody) -> tuple[Constraint | None, str]:
    """The decoding constraint a body asks for and the field it came from:
    ``response_format`` (chat), llama-server's top-level ``json_schema`` or its GBNF
    ``grammar`` (converted to llguidance's lark form). More than one is a 400, as in
    llama-server; a grammar that does not parse is a 400 naming ``grammar``."""
    asked: list[tuple[Constraint, str]] = []
    fmt = getattr(body, "response_format", None)
    from_format = format_constraint(fmt) if isinstance(fmt, ResponseFormat) else None
    if from_format is not None:
        asked.append((from_format, "response_format"))
    if body.json_schema is not None:
        asked.append((Constraint("json_schema", spec=json.dumps(body.json_schema)),
                      "json_schema"))
    if body.grammar is not None:
        asked.append((Constraint("lark", spec=gbnf_as_lark(body.grammar)), "grammar"))
    if len(asked) > 1:
        names = " and ".join(name for _, name in asked)
        raise bad_param(asked[1][1], f"Only one of response_format, json_schema and grammar "
                                     f"may be given; got {names}")
    return asked[0] if asked else (None, "response_format")


def gbnf_as_lark(grammar: str) -> str:
    """A GBNF grammar (llama.cpp's) as llguidance's lark grammar (400 naming ``grammar``
    when it does not convert)."""
    from llguidance.gbnf_to_lark import gbnf_to_lark

    try:
        return str(gbnf_to_lark(grammar))
    # The converter reads client text and raises more than its own error type (a bare
    # Exception for a grammar with no ``root`` rule): every failure is the grammar's.
    except Exception as exc:
        raise bad_param("grammar", f"Invalid grammar: {public_text(str(exc))}") from None


@dataclass(frozen=True)
class ToolPlan:
    """What a chat request does with its tools: render them (``tools``), parse calls from
    the output (``names``), and constrain decoding to one call (``constraint``) when the
    request requires a call or names the function."""

    tools: list[dict[str, Any]]
    names: list[str]
    constraint: Constraint | None = None

    @property
    def active(self) -> bool:
        return bool(self.names)


def plan_tools(tools: list[dict[str, Any]], choice: str, *, strict: bool = False) -> ToolPlan:
    """The plan for ``tools`` (OpenAI tool shapes) under ``choice``, in any API's terms:
    ``none`` (not offered), ``auto`` (offered, calls parsed), ``required`` (a call to any of
    them) or the name of the one function to call; a required or named call constrains
    decoding to the call's schema, so it always parses."""
    if not tools or choice == "none":
        return ToolPlan([], [])
    names = [t["function"]["name"] for t in tools]
    constraint = None
    if choice != "auto":
        only = None if choice == "required" else choice
        constraint = Constraint("json_schema", spec=json.dumps(call_schema(tools, only)),
                                strict=strict)
    return ToolPlan(tools, names, constraint)


def tool_plan(body: ChatCompletionRequest) -> ToolPlan:
    """A chat request's plan (``plan_tools``; ``strict`` if the called function asks)."""
    choice = body.tool_choice
    if not body.tools or choice == "none":
        return ToolPlan([], [])
    only = choice.function.name if isinstance(choice, NamedToolChoice) else None
    strict = any(bool(t.function.strict) for t in body.tools
                 if only is None or t.function.name == only)
    mode = only or ("required" if choice == "required" else "auto")
    return plan_tools([t.as_dict() for t in body.tools], mode, strict=strict)


def checked(constraint: Constraint | None, tok: Tokenizer, param: str,
            limits: ConstraintLimits | None = None) -> Constraint | None:
    """Compile ``constraint`` before admission: 400 naming ``param`` if the engine cannot,
    400 ``constraint_limit_exceeded`` naming the limit if it breaks one of ``limits``."""
    if constraint is not None:
        try:
            check_constraint(constraint, tok, limits)
        except ConstraintLimitError as exc:
            raise bad_param(param, f"Invalid {param}: {exc}",
                            code="constraint_limit_exceeded") from None
        except ConstraintError as exc:
            raise bad_param(param, f"Invalid {param}: {public_text(str(exc))}") from None
    return constraint
