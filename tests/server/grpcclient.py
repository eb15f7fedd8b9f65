"""gRPC client helpers for the tests: a channel to a live server's gRPC port, and the rich
error details (``google.rpc.Status``: ErrorInfo, RetryInfo, BadRequest) of a failed call."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from google.rpc import error_details_pb2, status_pb2

from sluice.v1 import inference_pb2_grpc
from tests.server.live import LiveServer


def grpc_target(live: LiveServer) -> str:
    port = live.server.config.app.state.ctx.grpc_port  # type: ignore[union-attr]
    assert port, "the server has no gRPC port"
    return f"127.0.0.1:{port}"


def stub(channel: grpc.Channel) -> inference_pb2_grpc.InferenceStub:
    return inference_pb2_grpc.InferenceStub(channel)


@dataclass
class Failure:
    """A failed call: its code, message and details."""

    code: grpc.StatusCode
    message: str
    reason: str | None
    """ErrorInfo.reason: sluice's error code."""
    http_status: str | None
    retry_delay_s: float | None
    fields: list[str]
    """BadRequest field violations."""


def failure(err: grpc.RpcError) -> Failure:
    """The details of a failed call (sync or asyncio client)."""
    assert isinstance(err, grpc.Call | grpc.aio.AioRpcError), err
    status = None
    for key, value in err.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            assert status.code == err.code().value[0]
            assert status.message == err.details()
    reason = http_status = retry = None
    fields: list[str] = []
    if status is not None:
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                assert info.domain == "sluice"
                reason, http_status = info.reason, info.metadata["http_status"]
            elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                ri = error_details_pb2.RetryInfo()
                detail.Unpack(ri)
                retry = ri.retry_delay.seconds + ri.retry_delay.nanos / 1e9
            elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                br = error_details_pb2.BadRequest()
                detail.Unpack(br)
                fields += [v.field for v in br.field_violations]
    return Failure(err.code(), err.details() or "", reason, http_status, retry, fields)
