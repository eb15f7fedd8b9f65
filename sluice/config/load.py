"""Reading a configuration: a TOML file parsed and validated, overrides applied over it,
and its validation errors described without showing secrets."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sluice.config.file import Config

SECRET_FIELD_WORDS = ("key", "password", "secret", "token", "url", "credential")
"""A configuration field whose name holds one of these may hold a secret (``api_keys``,
``admin_key``, ``metrics_key``, ``redis_url`` with its password)."""


def describe_errors(exc: ValidationError) -> str:
    """A configuration's validation errors, one ``field: message`` line each, fit to print:
    the value is shown only for a known field that cannot hold a secret, and only when it
    is a number, a boolean or a short string. Pydantic's own text shows every input, a whole
    tenant's table with its keys included (the input of a tenant-level error)."""
    lines = [f"{exc.error_count()} invalid setting(s):"]
    for err in exc.errors(include_url=False, include_context=False):
        where = ".".join(str(part) for part in err["loc"]) or "(file)"
        secret = any(word in str(part).lower() for part in err["loc"]
                     for word in SECRET_FIELD_WORDS)
        value = err.get("input")
        shown = ""
        known = err["type"] != "extra_forbidden"  # a misspelt field may be a secret's
        if known and not secret and (isinstance(value, bool | int | float)
                           or (isinstance(value, str) and len(value) <= 80)):
            shown = f" (got {value!r})"
        lines.append(f"  {where}: {err['msg']}{shown}")
    return "\n".join(lines)


def load_config(path: str | Path) -> Config:
    """Parse and validate a TOML config file."""
    with open(path, "rb") as f:
        return Config.model_validate(tomllib.load(f))


def with_overrides(config: Config, overrides: dict[str, dict[str, Any]]) -> Config:
    """A copy of ``config`` with ``{section: {field: value}}`` applied and re-validated."""
    data = config.model_dump()
    for section, fields in overrides.items():
        data.setdefault(section, {}).update({k: v for k, v in fields.items() if v is not None})
    return Config.model_validate(data)
