"""The gRPC error table: every sluice outcome (an ``APIError``, as the HTTP layer raises it)
to one gRPC status code, with a ``google.rpc.Status`` in the trailers that carries

- ``ErrorInfo``: ``reason`` = the code HTTP puts in ``error.code`` (``queue_full``,
  ``quota``, ``model_not_found``, ...), ``domain`` = ``sluice``, ``metadata.http_status``;
- ``RetryInfo``: the delay after which a retry can succeed (quota and overload refusals,
  exactly as computed for HTTP's ``Retry-After``, unrounded);
- ``BadRequest``: the invalid field, named as in the proto and the HTTP API.

The table is by sluice code where the code decides, else by HTTP status; docs/grpc.md
shows it and tests/server/test_grpc.py exercises every row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2

from sluice.server.errors import APIError

DOMAIN = "sluice"

#: sluice code → status, where the code alone decides.
BY_CODE: dict[str, grpc.StatusCode] = {
    "quota": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "queue_full": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "no_feasible_worker": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "deadline": grpc.StatusCode.DEADLINE_EXCEEDED,
    "deadline_infeasible": grpc.StatusCode.DEADLINE_EXCEEDED,
    "draining": grpc.StatusCode.UNAVAILABLE,
    "shutdown": grpc.StatusCode.UNAVAILABLE,
    "model_not_found": grpc.StatusCode.NOT_FOUND,
    "invalid_api_key": grpc.StatusCode.UNAUTHENTICATED,
    "cancelled": grpc.StatusCode.CANCELLED,
}

#: HTTP status → status, for every other code.
BY_HTTP_STATUS: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    500: grpc.StatusCode.INTERNAL,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def status_code(err: APIError) -> grpc.StatusCode:
    """The gRPC status for ``err``."""
    if err.code == "too_large":
        # 400: more tokens than the tenant's whole budget (ask for fewer); 503: more than
        # the server can hold at all.
        return (grpc.StatusCode.INVALID_ARGUMENT if err.status == 400
                else grpc.StatusCode.RESOURCE_EXHAUSTED)
    by_code = BY_CODE.get(err.code or "")
    if by_code is not None:
        return by_code
    return BY_HTTP_STATUS.get(err.status, grpc.StatusCode.UNKNOWN)


def _pack(message: Message) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


@dataclass(frozen=True)
class GrpcError:
    """What a servicer aborts with: the code, the message, and the rich status in the
    ``grpc-status-details-bin`` trailer."""

    code: grpc.StatusCode
    message: str
    status: status_pb2.Status

    def trailing_metadata(self) -> tuple[tuple[str, bytes], ...]:
        return (("grpc-status-details-bin", self.status.SerializeToString()),)


def grpc_error(err: APIError) -> GrpcError:
    """The gRPC error for an ``APIError``, with its details."""
    code = status_code(err)
    details = [_pack(error_details_pb2.ErrorInfo(
        reason=err.code or err.type, domain=DOMAIN,
        metadata={"http_status": str(err.status), "type": err.type}))]
    if err.retry_after_s is not None and code in (grpc.StatusCode.RESOURCE_EXHAUSTED,
                                                  grpc.StatusCode.UNAVAILABLE,
                                                  grpc.StatusCode.DEADLINE_EXCEEDED):
        delay = duration_pb2.Duration()
        seconds = max(0.0, err.retry_after_s)
        delay.seconds = int(seconds)
        delay.nanos = round((seconds - math.floor(seconds)) * 1e9) % 1_000_000_000
        details.append(_pack(error_details_pb2.RetryInfo(retry_delay=delay)))
    if err.param is not None and code == grpc.StatusCode.INVALID_ARGUMENT:
        details.append(_pack(error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=err.param,
                                                        description=err.message)])))
    message = f"{err.param}: {err.message}" if (
        err.param and code == grpc.StatusCode.INVALID_ARGUMENT
        and not err.message.startswith(err.param)) else err.message
    status = status_pb2.Status(code=code.value[0], message=message, details=details)
    return GrpcError(code, message, status)


__all__ = ["BY_CODE", "BY_HTTP_STATUS", "DOMAIN", "GrpcError", "grpc_error", "status_code"]
