"""One error for every failure, rendered in the shape of the API it came through: OpenAI's
``{"error": {"message", "type", "param", "code"}}`` everywhere but Anthropic Messages
(``/v1/messages``), whose shape is ``{"type": "error", "error": {"type", "message"}}`` with
Anthropic's status codes, and llama-server's native endpoints (``/completion``, ``/infill``,
``/props``, ``/slots`` ...), whose shape is ``{"error": {"code", "message", "type"}}`` with
the HTTP status as ``code`` (``error_response`` picks by path).

Each case has one status (the table is in docs/api.md); nothing internal leaks into a
message of a 500.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from sluice.policy.queues.admission import Rejection

log = logging.getLogger("sluice.server")

_PATH_RE = re.compile(r"""(?:[A-Za-z]:\\|~?/)(?:[^\s'"/\\:]+[/\\])+[^\s'",:;)\]]*""")
MAX_DETAIL_CHARS = 300
"""The longest piece of an exception's text a public error message carries."""


def public_text(detail: str) -> str:
    """Exception text made fit for a public error body: file paths (``/a/b``, ``~/a/b``,
    ``C:\\a\\b``) become ``<path>`` and the text is cut to ``MAX_DETAIL_CHARS``. The
    detail itself belongs in the log."""
    text = _PATH_RE.sub("<path>", detail)
    if len(text) > MAX_DETAIL_CHARS:
        text = text[: MAX_DETAIL_CHARS - 3] + "..."
    return text


class APIError(Exception):
    """An error with its HTTP status, OpenAI error type and machine-readable code."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        retry_after_s: float | None = None,
        headers: dict[str, str] | None = None,
        fields: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.retry_after_s = retry_after_s
        self.headers = dict(headers or {})
        self.fields = dict(fields or {})
        """More members of the error object (``context_exceeded``'s counts)."""

    def all_headers(self) -> dict[str, str]:
        """The error's headers, ``Retry-After`` (whole seconds, at least 1) included."""
        headers = dict(self.headers)
        if self.retry_after_s is not None:
            headers["Retry-After"] = str(max(1, math.ceil(self.retry_after_s)))
        return headers

    def response(self, type: str | None = None) -> JSONResponse:
        """OpenAI's shape (``type``: another error type than the error's own)."""
        headers = self.all_headers()
        body = {
            "error": {
                "message": self.message,
                "type": type or self.type,
                "param": self.param,
                "code": self.code,
                **self.fields,
            }
        }
        return JSONResponse(body, status_code=self.status, headers=headers)


def context_exceeded(message: str, param: str, n_prompt_tokens: int, n_ctx: int) -> APIError:
    """400 ``context_length_exceeded``: OpenAI's error, with llama-server's
    ``n_prompt_tokens`` (the prompt's tokens; for one refused from its length before it
    was tokenized, the fewest it can have) and ``n_ctx`` (the tokens one sequence holds, or
    the whole context where that is what the prompt is measured against)."""
    return APIError(400, message, param=param, code="context_length_exceeded",
                    fields={"n_prompt_tokens": n_prompt_tokens, "n_ctx": n_ctx})


LLAMA_CONTEXT_ERROR_TYPE = "exceed_context_size_error"
"""llama-server's error type for a prompt past the context."""


ANTHROPIC_STATUS: dict[int, tuple[int, str]] = {
    400: (400, "invalid_request_error"),
    401: (401, "authentication_error"),
    403: (403, "permission_error"),
    404: (404, "not_found_error"),
    413: (413, "request_too_large"),
    429: (429, "rate_limit_error"),
    500: (500, "api_error"),
    503: (529, "overloaded_error"),
    504: (504, "timeout_error"),
}
"""sluice's status → Anthropic's status and error type (others: 4xx
``invalid_request_error``, 5xx 500 ``api_error``); overload is Anthropic's 529."""


def anthropic_error(err: APIError) -> tuple[int, dict[str, Any]]:
    """``err`` as Anthropic Messages reports it: its status and body."""
    default = (err.status, "invalid_request_error") if err.status < 500 else (500, "api_error")
    status, etype = ANTHROPIC_STATUS.get(err.status, default)
    return status, {"type": "error", "error": {"type": etype, "message": err.message}}


def ollama_response(err: APIError) -> JSONResponse:
    """``err`` in Ollama's shape, ``{"error": message}`` (its status, ``Retry-After`` and
    decision headers kept)."""
    return JSONResponse({"error": err.message}, status_code=err.status,
                        headers=err.all_headers())


def _anthropic_response(err: APIError) -> JSONResponse:
    status, body = anthropic_error(err)
    return JSONResponse(body, status_code=status, headers=err.all_headers())


LLAMA_SERVER_TYPES: dict[int, str] = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 500: "server_error", 501: "not_supported_error",
    503: "unavailable_error",
}
"""llama-server's error type per status (``format_error_response``); other statuses keep
sluice's type."""


def llama_server_error(err: APIError) -> dict[str, Any]:
    """``err`` as llama-server's native endpoints report it (a prompt past the context is
    its ``exceed_context_size_error``); the shape has no ``param``, so a message that does
    not name the field it blames starts with it."""
    etype = (LLAMA_CONTEXT_ERROR_TYPE if err.code == "context_length_exceeded"
             else LLAMA_SERVER_TYPES.get(err.status, err.type))
    message = err.message
    if err.param and err.param not in message:
        message = f"{err.param}: {message}"
    return {"error": {"code": err.status, "message": message, "type": etype, **err.fields}}


def _llama_server_response(err: APIError) -> JSONResponse:
    return JSONResponse(llama_server_error(err), status_code=err.status,
                        headers=err.all_headers())


LLAMA_SERVER_PATHS = ("/completion", "/completions", "/infill", "/props", "/apply-template",
                      "/slots")
"""llama-server's native endpoints (not its OpenAI-compatible ones)."""

ERROR_SHAPES: tuple[tuple[str, Callable[[APIError], JSONResponse]], ...] = (
    ("/v1/messages", _anthropic_response),
    ("/api", ollama_response),
    *((path, _llama_server_response) for path in LLAMA_SERVER_PATHS),
)
"""Path prefixes whose API has its own error shape (every other path: OpenAI's)."""


LLAMA_SERVER_OPENAI_PATHS = frozenset({"/chat/completions", "/responses", "/embeddings"})
"""OpenAI's endpoints at llama-server's paths (no ``/v1``): OpenAI's error shape, with
llama-server's error type for a prompt past the context (at ``/v1/...`` it is OpenAI's
``invalid_request_error``; the ``code`` is ``context_length_exceeded`` on both)."""


def error_response(err: APIError, path: str) -> JSONResponse:
    """``err`` in the shape of the API at ``path``."""
    for prefix, render in ERROR_SHAPES:
        if path == prefix or path.startswith(prefix + "/"):
            return render(err)
    if err.code == "context_length_exceeded" and path in LLAMA_SERVER_OPENAI_PATHS:
        return err.response(LLAMA_CONTEXT_ERROR_TYPE)
    return err.response()


def bad_param(param: str, message: str, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def unknown_model(model: str) -> APIError:
    return APIError(
        404, f"The model '{model}' does not exist", param="model", code="model_not_found"
    )


def no_chat_template(model: str) -> APIError:
    """A chat request to a completion model (no chat template in its file, none configured)."""
    return APIError(
        400, f"The model '{model}' is a completion model: it has no chat template, so it "
             f"takes prompts (/v1/completions), not messages. An operator can give it one "
             f"with the model's chat_template option (--chat-template).",
        param="model", code="model_has_no_chat_template")


def unauthorized(message: str = "Missing or invalid API key") -> APIError:
    return APIError(401, message, type="authentication_error", code="invalid_api_key")


#: Rejection reason → (status, OpenAI error type).
REJECTION_STATUS: dict[str, tuple[int, str]] = {
    "queue_full": (503, "server_overloaded"),
    "draining": (503, "server_shutting_down"),
    "deadline_infeasible": (503, "deadline_infeasible"),
    "no_feasible_worker": (503, "server_overloaded"),
    "quota": (429, "rate_limit_exceeded"),
    "too_large": (400, "invalid_request_error"),
}


def rejection_error(rejection: Rejection) -> APIError:
    status, etype = REJECTION_STATUS.get(rejection.reason, (503, "server_overloaded"))
    return APIError(
        status,
        rejection.message,
        type=etype,
        code=rejection.reason,
        retry_after_s=rejection.retry_after_s if status in (429, 503) else None,
    )


#: Terminal error codes from the runtime → (status, type, public message or None to
#: pass the runtime's message through).
FINAL_STATUS: dict[str, tuple[int, str, str | None]] = {
    "deadline": (504, "deadline_exceeded", None),
    "deadline_infeasible": (503, "deadline_infeasible", None),
    "backend_error": (500, "server_error", "The model failed while running this request."),
    # 503: the server cannot serve the model now (a fixed file, an admin load, or a
    # replacement worker may make it serve); the detail, which may name files, is logged.
    "model_load_failed": (503, "server_error", "The model could not be loaded."),
    "context_length_exceeded": (400, "invalid_request_error", None),
    "too_large": (503, "server_overloaded", None),
    "pinned_full": (503, "server_overloaded", None),
    "shutdown": (503, "server_shutting_down", None),
    "internal_error": (500, "server_error", None),
    "worker_failed": (500, "server_error", None),
    "invalid_request_error": (400, "invalid_request_error", None),
}


def final_error(code: str | None, message: str | None, status_name: str,
                retry_after_s: float | None = None) -> APIError:
    """The HTTP error for a request that ended without completing (a 503's Retry-After is
    ``retry_after_s`` when the runtime computed one)."""
    if status_name == "CANCELLED" and code is None:
        return APIError(499, message or "cancelled", type="cancelled", code="cancelled")
    if status_name == "EXPIRED":
        code = "deadline"
    status, etype, public = FINAL_STATUS.get(code or "", (500, "server_error",
                                                          "Internal error."))
    retry = (retry_after_s if retry_after_s is not None else 1.0) if status == 503 else None
    if public is None and message:
        public = public_text(message)
        if public != message:
            log.warning("request failed (%s): %s", code, message)
    return APIError(status, public or etype, type=etype, code=code, retry_after_s=retry)


async def api_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return error_response(exc, request.url.path)


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "none", "dict", "list"})


def _is_union_tag(part: Any) -> bool:
    """pydantic names the member of a union it tried (``str``, ``list[ContentPart]``,
    ``function-after[...]``, ``NamedToolChoice``) in an error's location; no field of ours
    looks like that."""
    return isinstance(part, str) and (part in _TYPE_TAGS or "[" in part or part[:1].isupper())


def _most_telling(errors: list[Any]) -> Any:
    """The first error, or for a union, the member's error that reached deepest (a bad
    content part rather than "Input should be a valid string")."""
    first = errors[0]
    loc = list(first.get("loc", ()))
    tags = [i for i, p in enumerate(loc) if _is_union_tag(p)]
    if not tags:
        return first
    prefix = loc[: tags[0]]
    same = [e for e in errors if list(e.get("loc", ()))[: len(prefix)] == prefix]
    return max(same, key=lambda e: len([p for p in e.get("loc", ()) if not _is_union_tag(p)]))


def validation_error(errors: list[Any]) -> APIError:
    """The 400 for pydantic's errors about a body: malformed JSON → ``invalid_json``; a bad
    field → ``invalid_value`` naming it (``param``, dotted: ``messages.0.role``)."""
    first = _most_telling(errors) if errors else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body" and not _is_union_tag(p)]
    if first.get("type") == "json_invalid" or not errors:
        return APIError(400, "Request body is not valid JSON", code="invalid_json")
    if not loc and first.get("type") == "value_error":
        # A check across fields: the body is JSON, it just asks for something invalid.
        msg = first.get("msg", "invalid request")
        return APIError(400, f"Invalid request: {msg}", code="invalid_value")
    if not loc:
        return APIError(400, "Request body must be a JSON object", code="invalid_json")
    param = ".".join(loc) or None
    msg = first.get("msg", "invalid value")
    return bad_param(param or "body", f"Invalid value for '{param}': {msg}")


async def validation_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return error_response(validation_error(list(exc.errors())), request.url.path)


def request_timeout(message: str) -> APIError:
    """408: the request body did not arrive in time. The connection closes after it: the
    rest of the body is never read."""
    return APIError(408, message, code="request_timeout", headers={"connection": "close"})


async def http_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}.get(
        exc.status_code)
    if exc.status_code == 408:  # GuardMiddleware's body deadline, raised inside the parser
        return error_response(request_timeout(str(exc.detail)), request.url.path)
    if exc.status_code == 400:
        # FastAPI's body parser: not UTF-8, nested too deep, an integer too long, ...
        return error_response(APIError(400, "Request body is not valid JSON",
                                       code="invalid_json"), request.url.path)
    return error_response(APIError(exc.status_code, str(exc.detail), code=code),
                          request.url.path)


async def unhandled_error_handler(request: Request, exc: Exception) -> JSONResponse:
    return error_response(APIError(500, "Internal error.", type="server_error",
                                   code="internal_error"), request.url.path)
