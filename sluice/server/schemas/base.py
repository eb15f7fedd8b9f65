"""The base of every request body, and the limits and checks that every surface which takes
the same field applies alike.

Unknown fields are kept aside (``extra="allow"``) rather than refused: routes ignore them,
say so in the ``x-sluice-ignored-fields`` header (``ignored_fields``), and refuse them with
400 only when ``server.strict_fields`` is set, as OpenAI's peers do.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

MAX_STOP = 4
MAX_STOP_CHARS = 256
"""The longest stop sequence (characters): the detokenizer holds back this much text."""
MAX_CHOICES = 16
"""The most choices (``n``) a request may ask for; a model also caps it at its sequence
slots (``n_seq_max``)."""
MAX_TOP_LOGPROBS = 20
MAX_LOGIT_BIAS = 1024
MAX_TOOLS = 128
Priority = Annotated[int, Field(ge=0, le=9)]
DeadlineMs = Annotated[float, Field(gt=0, le=86_400_000)]
FunctionName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]


def check_stop(v: str | list[str] | None) -> str | list[str] | None:
    """Stop sequences, on every surface that takes them: at most ``MAX_STOP``, each 1 to
    ``MAX_STOP_CHARS`` characters."""
    items = [v] if isinstance(v, str) else (v or [])
    if len(items) > MAX_STOP:
        raise ValueError(f"at most {MAX_STOP} stop sequences")
    if any(not s or len(s) > MAX_STOP_CHARS for s in items):
        raise ValueError(f"stop sequences must be 1 to {MAX_STOP_CHARS} characters")
    return v


Stop = Annotated[str | list[str], AfterValidator(check_stop)]
"""A ``stop`` field of one sequence or a list (OpenAI's and llama-server's), ``check_stop``ed."""
StopList = Annotated[list[str], AfterValidator(check_stop)]
"""A list of stop sequences (Ollama's ``stop``, Anthropic's ``stop_sequences``), checked alike."""


MAX_SCHEMA_CHARS = 100_000
"""The longest tool schema (its JSON text)."""


def check_json_schema(schema: dict[str, Any], what: str) -> dict[str, Any]:
    """A tool's schema, on every surface that takes tools: at most ``MAX_SCHEMA_CHARS`` of
    JSON, and valid against JSON Schema draft 2020-12's metaschema, as OpenAI and Anthropic
    check it whether or not the tool is called (a schema that only fails once a call is
    forced would answer some requests and not others); ``ValueError`` naming ``what`` and
    the first fault."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    if len(json.dumps(schema)) > MAX_SCHEMA_CHARS:
        raise ValueError(f"{what} is too large (over {MAX_SCHEMA_CHARS} characters of JSON)")
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "the root"
        raise ValueError(f"{what} is not a valid JSON schema (draft 2020-12) at {where}: "
                         f"{exc.message[:200]}") from None
    except RecursionError:
        raise ValueError(f"{what} is nested too deep") from None
    return schema


def check_unique_names(names: list[str], what: str) -> None:
    """Tool names, on every surface that takes tools: no name twice (``what`` names them
    in the error)."""
    if len(set(names)) != len(names):
        raise ValueError(f"{what} must be unique")


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")

    @field_validator("*", mode="after")
    @classmethod
    def _encodable(cls, v: Any) -> Any:
        """JSON's ``\\ud800`` escapes decode to lone surrogates, which no tokenizer or
        response encoder can take: refuse them here, naming the field."""
        for s in ([v] if isinstance(v, str) else v if isinstance(v, list) else ()):
            if isinstance(s, str):
                try:
                    s.encode("utf-8")
                except UnicodeEncodeError:
                    raise ValueError("text must be valid Unicode (no lone surrogates)") from None
        return v


def ignored_fields(body: BaseModel, prefix: str = "") -> list[str]:
    """Paths of the unknown fields in ``body`` and its nested bodies, e.g.
    ``["frobnicate", "messages.0.mood"]``."""
    found = [f"{prefix}{k}" for k in (body.model_extra or {})]
    for name in type(body).model_fields:
        value = getattr(body, name)
        items = list(enumerate(value)) if isinstance(value, list) else [(None, value)]
        for i, item in items:
            if isinstance(item, BaseModel):
                path = f"{prefix}{name}." if i is None else f"{prefix}{name}.{i}."
                found.extend(ignored_fields(item, path))
    return found
