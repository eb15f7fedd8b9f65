"""The access log: one line per API request, HTTP or gRPC, on logger ``sluice.access``.

Fields: ``request_id``, ``protocol``, ``method``, ``path``, ``status`` (HTTP status, or the
gRPC code's name), ``tenant``, ``model`` (as asked: a model or a group), ``variant``,
``worker``, ``finish_reason``, ``error`` (sluice's code), ``queue_wait_ms``, ``ttft_ms``,
``prompt_tokens``, ``completion_tokens``, ``duration_ms``; the prompt text (``prompt``) only
with ``server.log_content`` (a debug setting, off by default).

With ``--log-format json`` every field is a key of the line's JSON object (the fields ride
on the record as ``extra``); in text, the message lists them as ``key=value``, a value
holding a space, a quote, ``=``, a backslash or any control character written as a JSON
string (``path="/a\\nb"``), so a client cannot start a line or forge a field.

The edge (the HTTP middleware, a gRPC handler) opens a record for the request in a context
variable; ``admit`` notes the runtime requests on it, so the routes need not pass it around.
Operational endpoints (``/health``, ``/ready``, ``/metrics``, ``/status``) are logged at
DEBUG: probes and scrapes would drown the rest.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sluice.engine.request import Request as RtRequest

log = logging.getLogger("sluice.access")
QUIET_PATHS = ("/health", "/ready", "/metrics", "/status", "/status.json")
_BARE = re.compile(r"[^\s\"=\\\x00-\x1f\x7f-\x9f\u2028\u2029]+")
"""A text value written as it is: no space, quote, ``=``, backslash or control character."""
_UNSAFE = re.compile(r"[\x7f-\x9f\u2028\u2029]")
"""What ``json.dumps(..., ensure_ascii=False)`` leaves unescaped but a terminal or a log
reader may take as a line break or a control."""


@dataclass
class AccessRecord:
    """What one API request did, filled in as it goes."""

    request_id: str
    protocol: str
    method: str
    path: str
    started_s: float = field(default_factory=time.perf_counter)
    model: str | None = None
    requests: list[RtRequest] = field(default_factory=list)
    prompt: str | None = None


_current: contextvars.ContextVar[AccessRecord | None] = contextvars.ContextVar(
    "sluice_access", default=None)


def begin(request_id: str, protocol: str, method: str, path: str) -> AccessRecord:
    """Open the record of the request running in this context."""
    record = AccessRecord(request_id, protocol, method, path)
    _current.set(record)
    return record


def note_admitted(reqs: Sequence[RtRequest]) -> None:
    """The runtime requests of the current API request (called before admission, while
    ``model_id`` is still the name the client asked for)."""
    record = _current.get()
    if record is not None and reqs:
        record.model = record.model or reqs[0].model_id or None
        record.requests.extend(reqs)


def note_prompt(text: str) -> None:
    """The prompt text; kept only if the server logs content (``server.log_content``)."""
    record = _current.get()
    if record is not None:
        record.prompt = text


def fields(record: AccessRecord, status: int | str, *, log_content: bool) -> dict[str, Any]:
    """The line's fields (None where the request never got that far)."""
    reqs = record.requests
    first = reqs[0] if reqs else None
    waits = [r.times.started_s - r.times.queued_s for r in reqs
             if r.times.started_s is not None and r.times.queued_s is not None]
    ttfts = [r.times.first_token_s - r.times.arrival_s for r in reqs
             if r.times.first_token_s is not None]
    finals = [r.final for r in reqs if r.final is not None]
    out: dict[str, Any] = {
        "request_id": record.request_id,
        "protocol": record.protocol,
        "method": record.method,
        "path": record.path,
        "status": status,
        "tenant": first.tenant_id if first else None,
        "model": record.model,
        "variant": next((r.variant for r in reqs if r.variant), None),
        "worker": first.worker_id if first else None,
        "finish_reason": finals[0].finish_reason if finals else None,
        "error": next((f.error_code for f in finals if f.error_code), None),
        "queue_wait_ms": round(max(waits) * 1000, 3) if waits else None,
        "ttft_ms": round(min(ttfts) * 1000, 3) if ttfts else None,
        "prompt_tokens": sum(len(r.prompt_tokens) for r in reqs) if reqs else None,
        "completion_tokens": sum(f.completion_tokens for f in finals) if finals else None,
        "duration_ms": round((time.perf_counter() - record.started_s) * 1000, 3),
    }
    if log_content and record.prompt is not None:
        out["prompt"] = record.prompt
    return out


def emit(record: AccessRecord, status: int | str, *, log_content: bool) -> None:
    """Write the access line of ``record``."""
    quiet = record.path in QUIET_PATHS
    level = logging.DEBUG if quiet else logging.INFO
    if not log.isEnabledFor(level):
        return
    data = fields(record, status, log_content=log_content)
    message = " ".join(f"{k}={text_value(v)}" for k, v in data.items()
                       if v is not None and k != "prompt")
    log.log(level, message, extra=data)


def text_value(value: Any) -> str:
    """``value`` as one ``key=value`` field of a text line: bare when it is a plain word,
    else a JSON string with every control character escaped."""
    text = str(value)
    if _BARE.fullmatch(text):
        return text
    quoted = json.dumps(text, ensure_ascii=False)
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", quoted)
