"""The gRPC API through a real grpc client against a live server (HTTP and gRPC on one event
loop), on synthetic models: streaming, the same answers as HTTP, cancel frees KV, the gRPC
deadline is sluice's deadline, 64 concurrent calls against a small queue, health following
readiness, reflection, and every row of the error table."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from sluice.server.errors import FINAL_STATUS, REJECTION_STATUS, APIError
from sluice.server.grpc.errors import BY_CODE, status_code
from sluice.v1 import inference_pb2 as pb
from sluice.v1 import inference_pb2_grpc
from tests.server.grpcclient import Failure, failure, grpc_target, stub
from tests.server.live import (
    ROOT,
    LiveServer,
    config_with,
    metric_sum,
    scrape,
    synth_chat,
    synth_embed,
    synth_rerank,
    wait_for,
)

CHAT = "synth-chat"


def _variant(model_id: str, accuracy: float, batch_fixed_s: float) -> dict[str, Any]:
    return {"id": model_id, "kind": "oneshot", "backend": "synthetic",
            "task": "classification", "memory_bytes": 10_000_000, "load_cost_s": 0.1,
            "options": {"accuracy": accuracy, "batch_fixed_s": batch_fixed_s,
                        "per_item_s": 0.0005, "load_s": 0.0, "labels": ["neg", "pos"]}}


def _config(**sections: Any) -> Any:
    models = sections.pop("models", [
        synth_chat(CHAT), synth_embed("synth-a"), synth_rerank(), _variant("slow", 0.9, 0.06),
        _variant("fast", 0.8, 0.002)])
    server = {"grpc_port": 0, **sections.pop("server", {})}
    groups = sections.pop("groups", [{"id": "sentiment", "variants": ["slow", "fast"],
                                      "low_load_utilization": 0.0}])
    return config_with(models=models, groups=groups, server=server,
                       workers=sections.pop("workers", {"count": 1, "budget_bytes": 10**9}),
                       **sections)


@pytest.fixture(scope="module")
def live(serve_module: Callable[..., LiveServer]) -> LiveServer:
    return serve_module(_config())


@pytest.fixture
def channel(live: LiveServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(grpc_target(live)) as ch:
        yield ch


def _generate(channel: grpc.Channel, **fields: Any) -> list[pb.GenerateResponse]:
    return list(stub(channel).Generate(pb.GenerateRequest(**fields), timeout=30))


def _fails(call: Callable[[], Any]) -> Failure:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return failure(info.value)


# -- the RPCs ----------------------------------------------------------------------------


def test_generate_streams_tokens_then_one_done(live: LiveServer,
                                               channel: grpc.Channel) -> None:
    out = _generate(channel, model=CHAT, prompt="the river runs", max_tokens=6, temperature=0)
    *tokens, last = out
    assert [m.WhichOneof("event") for m in tokens] == ["token"] * 6
    assert [m.token.index for m in tokens] == list(range(6))
    assert last.WhichOneof("event") == "done"
    done = last.done
    assert done.finish_reason == "length"
    assert done.usage.completion_tokens == 6
    assert done.usage.total_tokens == done.usage.prompt_tokens + 6
    assert done.decision.request_id and done.decision.tenant == "default"
    assert done.decision.HasField("worker") and done.decision.HasField("queue_wait_ms")
    # The same runtime answers HTTP: the same text for the same greedy request.
    with live.client() as c:
        r = c.post("/v1/completions", json={"model": CHAT, "prompt": "the river runs",
                                            "max_tokens": 6, "temperature": 0})
    assert r.status_code == 200, r.text
    assert "".join(m.token.text for m in tokens) == r.json()["choices"][0]["text"]


def test_generate_from_chat_messages(channel: grpc.Channel) -> None:
    messages = pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="hi there")])
    out = _generate(channel, model=CHAT, messages=messages, max_tokens=3)
    assert out[-1].done.usage.completion_tokens == 3
    assert out[-1].done.usage.prompt_tokens > 2


def test_infer_serves_a_group_and_says_which_variant(channel: grpc.Channel) -> None:
    s = stub(channel)
    tight = s.Infer(pb.InferRequest(model="sentiment", input="a fine day"), timeout=0.03)
    assert tight.decision.variant == "fast"  # slow needs 60 ms alone: the deadline decides
    assert tight.decision.HasField("predicted_wait_ms")
    assert set(tight.classification.scores) == {"neg", "pos"}
    assert tight.classification.label in ("neg", "pos")
    relaxed = s.Infer(pb.InferRequest(model="sentiment", input="a fine day"), timeout=5)
    assert relaxed.decision.variant == "slow"
    assert relaxed.model == "sentiment"
    direct = s.Infer(pb.InferRequest(model="synth-a", input="vector please"), timeout=5)
    assert len(direct.embedding.values) == 16


def test_embed_matches_http(live: LiveServer, channel: grpc.Channel) -> None:
    resp = stub(channel).Embed(pb.EmbedRequest(model="synth-a", input=["one", "two words"]),
                               timeout=5)
    assert resp.usage.prompt_tokens == 2 + 3  # each input's BOS and words
    with live.client() as c:
        r = c.post("/v1/embeddings", json={"model": "synth-a", "input": ["one", "two words"]})
    http = [d["embedding"] for d in r.json()["data"]]
    assert r.json()["usage"]["prompt_tokens"] == resp.usage.prompt_tokens
    assert len(resp.data) == len(http) == 2
    for got, want in zip(resp.data, http, strict=True):
        assert list(got.values) == pytest.approx(want, rel=1e-6)


def test_list_models(channel: grpc.Channel) -> None:
    models = {m.id: m for m in stub(channel).ListModels(pb.ListModelsRequest(),
                                                        timeout=5).models}
    assert models[CHAT].kind == "generative" and models[CHAT].resident
    assert list(models["sentiment"].variants) == ["slow", "fast"]
    assert models["sentiment"].kind == "group"


def test_priority_rides_in_metadata(channel: grpc.Channel) -> None:
    out = list(stub(channel).Generate(pb.GenerateRequest(model=CHAT, prompt="x", max_tokens=2),
                                      metadata=[("x-sluice-priority", "1")], timeout=10))
    assert out[-1].done.finish_reason == "length"
    f = _fails(lambda: list(stub(channel).Generate(
        pb.GenerateRequest(model=CHAT, prompt="x", max_tokens=2),
        metadata=[("x-sluice-priority", "high")], timeout=10)))
    assert f.code == grpc.StatusCode.INVALID_ARGUMENT
    assert f.fields == ["x-sluice-priority"]


# -- the error table -----------------------------------------------------------------------


@pytest.mark.parametrize(("fields", "field"), [
    ({"temperature": 5.0, "prompt": "x"}, "temperature"),
    ({"top_p": 0.0, "prompt": "x"}, "top_p"),
    ({"max_tokens": 100_000, "prompt": "x"}, "max_tokens"),
    ({"stop": ["a", "b", "c", "d", "e"], "prompt": "x"}, "stop"),
    ({}, "prompt"),
    ({"messages": pb.ChatMessages(messages=[pb.ChatMessage(role="robot", content="x")])},
     "messages.0.role"),
    ({"messages": pb.ChatMessages()}, "messages"),
])
def test_invalid_argument_names_the_field(channel: grpc.Channel, fields: dict[str, Any],
                                          field: str) -> None:
    f = _fails(lambda: _generate(channel, model=CHAT, **fields))
    assert f.code == grpc.StatusCode.INVALID_ARGUMENT
    assert f.fields == [field], f
    assert f.message.startswith(field)
    assert f.http_status == "400"
    # The server still serves after a bad request.
    assert _generate(channel, model=CHAT, prompt="ok", max_tokens=2)[-1].done.usage


def test_invalid_argument_for_one_shot_inputs(channel: grpc.Channel) -> None:
    s = stub(channel)
    f = _fails(lambda: s.Embed(pb.EmbedRequest(model="synth-a"), timeout=5))
    assert (f.code, f.fields) == (grpc.StatusCode.INVALID_ARGUMENT, ["input"])
    f = _fails(lambda: s.Infer(pb.InferRequest(model=CHAT, input="x"), timeout=5))
    assert (f.code, f.fields, f.reason) == (grpc.StatusCode.INVALID_ARGUMENT, ["model"],
                                           "model_kind_mismatch")
    f = _fails(lambda: s.Embed(pb.EmbedRequest(model="slow", input=["x"]), timeout=5))
    assert (f.code, f.fields) == (grpc.StatusCode.INVALID_ARGUMENT, ["model"])
    f = _fails(lambda: s.Infer(pb.InferRequest(model="synth-rerank", input="x"), timeout=5))
    assert (f.code, f.fields, f.reason) == (grpc.StatusCode.INVALID_ARGUMENT, ["model"],
                                           "model_kind_mismatch")
    assert "/v1/rerank" in f.message


def test_not_found(channel: grpc.Channel) -> None:
    f = _fails(lambda: _generate(channel, model="nope", prompt="x"))
    assert (f.code, f.reason, f.http_status) == (grpc.StatusCode.NOT_FOUND, "model_not_found",
                                                 "404")
    f = _fails(lambda: stub(channel).Infer(pb.InferRequest(model="nope", input="x"), timeout=5))
    assert f.code == grpc.StatusCode.NOT_FOUND


def test_unauthenticated_without_a_valid_key(serve: Callable[..., LiveServer]) -> None:
    live = serve(_config(tenants=[{"id": "acme", "api_keys": ["key-acme"]}]))
    with grpc.insecure_channel(grpc_target(live)) as ch:
        s = stub(ch)
        for metadata in ([], [("authorization", "Bearer wrong")], [("authorization", "key")]):
            f = _fails(lambda md=metadata: s.ListModels(pb.ListModelsRequest(), metadata=md,
                                                        timeout=5))
            assert (f.code, f.reason) == (grpc.StatusCode.UNAUTHENTICATED, "invalid_api_key")
        out = list(s.Generate(pb.GenerateRequest(model=CHAT, prompt="x", max_tokens=2),
                              metadata=[("authorization", "Bearer key-acme")], timeout=10))
        assert out[-1].done.decision.tenant == "acme"


def test_the_key_is_checked_before_the_model(serve: Callable[..., LiveServer]) -> None:
    live = serve(_config(tenants=[{"id": "acme", "api_keys": ["key-acme"]}]))
    with grpc.insecure_channel(grpc_target(live)) as ch:
        s = stub(ch)
        # without a key an unknown and a known model answer alike: names cannot be listed
        for model in ("nope", "synth-a"):
            f = _fails(lambda m=model: s.Infer(pb.InferRequest(model=m, input="x"), timeout=5))
            assert f.code == grpc.StatusCode.UNAUTHENTICATED, model
            f = _fails(lambda m=model: s.Embed(pb.EmbedRequest(model=m, input=["x"]),
                                               timeout=5))
            assert f.code == grpc.StatusCode.UNAUTHENTICATED, model
        key = [("authorization", "Bearer key-acme")]
        assert s.Embed(pb.EmbedRequest(model="synth-a", input=["x"]), metadata=key,
                       timeout=10).data


def test_one_body_limit_for_both_transports(serve: Callable[..., LiveServer]) -> None:
    live = serve(_config(server={"max_body_bytes": 4096}))
    big = "x" * 8192
    with live.client() as c:
        assert c.post("/v1/completions", json={"model": CHAT, "prompt": big}).status_code == 413
    with grpc.insecure_channel(grpc_target(live)) as ch:
        f = _fails(lambda: _generate(ch, model=CHAT, prompt=big, max_tokens=2))
        assert f.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert _generate(ch, model=CHAT, prompt="x", max_tokens=2)[-1].done.usage


def test_calls_past_the_rpc_cap_are_refused_at_once(serve: Callable[..., LiveServer]) -> None:
    live = serve(_config(server={"grpc_max_concurrent_rpcs": 1}))
    with grpc.insecure_channel(grpc_target(live)) as ch:
        s = stub(ch)
        held = s.Generate(pb.GenerateRequest(model=CHAT, prompt="x", max_tokens=200,
                                             ignore_eos=True), timeout=30)
        next(held)  # the first call is in progress
        f = _fails(lambda: _generate(ch, model=CHAT, prompt="x", max_tokens=2))
        assert f.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        held.cancel()
        wait_for(lambda: live.runtime.snapshot().live_requests == 0)
        assert _generate(ch, model=CHAT, prompt="x", max_tokens=2)[-1].done.usage


def test_quota_is_resource_exhausted_with_a_retry_delay(
        serve: Callable[..., LiveServer]) -> None:
    live = serve(_config(tenants=[{"id": "acme", "api_keys": ["k"],
                                   "limits": {"requests_per_s": 0.2, "burst": 1}}]))
    md = [("authorization", "Bearer k")]
    with grpc.insecure_channel(grpc_target(live)) as ch:
        s = stub(ch)
        assert s.Infer(pb.InferRequest(model="synth-a", input="x"), metadata=md, timeout=5)
        f = _fails(lambda: s.Infer(pb.InferRequest(model="synth-a", input="x"), metadata=md,
                                   timeout=5))
    assert (f.code, f.reason, f.http_status) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "quota",
                                                 "429")
    # One request per 5 s, the bucket just emptied: about 5 s, as HTTP's Retry-After.
    assert f.retry_delay_s is not None and 4.0 < f.retry_delay_s <= 5.0


def test_an_infeasible_deadline_is_refused_at_once(serve: Callable[..., LiveServer]) -> None:
    """Both variants need 200 ms or more; a 100 ms gRPC deadline is refused by the planner
    at once (DEADLINE_EXCEEDED with sluice's reason, not the client's own timer)."""
    live = serve(_config(models=[synth_chat(CHAT), _variant("slow", 0.9, 0.3),
                                 _variant("fast", 0.8, 0.2)]))
    with grpc.insecure_channel(grpc_target(live)) as ch:
        f = _fails(lambda: stub(ch).Infer(pb.InferRequest(model="sentiment", input="x"),
                                          timeout=0.1))
    assert (f.code, f.reason) == (grpc.StatusCode.DEADLINE_EXCEEDED, "deadline_infeasible")
    assert f.retry_delay_s is not None


def test_the_grpc_deadline_is_the_requests_deadline(serve: Callable[..., LiveServer]) -> None:
    """A generation that would take ~2 s under a 300 ms gRPC deadline: the client sees
    DEADLINE_EXCEEDED, and on the server the request ends EXPIRED at that deadline, its KV
    blocks freed."""
    live = serve(_config(models=[synth_chat(CHAT, step_fixed_s=0.02)], groups=[]))
    with grpc.insecure_channel(grpc_target(live)) as ch:
        t0 = time.monotonic()
        f = _fails(lambda: list(stub(ch).Generate(
            pb.GenerateRequest(model=CHAT, prompt="x", max_tokens=100), timeout=0.3)))
        elapsed = time.monotonic() - t0
    assert f.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert elapsed < 1.5
    with live.client() as c:
        wait_for(lambda: metric_sum(scrape(c), "sluice_requests_total", state="expired") == 1)
        samples = scrape(c)
    assert metric_sum(samples, "sluice_requests_total", state="cancelled") == 0
    assert metric_sum(samples, "sluice_kv_blocks_used") == 0


def test_draining_is_unavailable_and_health_not_serving(
        serve: Callable[..., LiveServer]) -> None:
    live = serve(_config())
    with grpc.insecure_channel(grpc_target(live)) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        check = health.Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert check.status == health_pb2.HealthCheckResponse.SERVING
        live.runtime.begin_drain()
        f = _fails(lambda: _generate(ch, model=CHAT, prompt="x", max_tokens=2))
        assert (f.code, f.reason) == (grpc.StatusCode.UNAVAILABLE, "draining")
        for service in ("", "sluice.v1.Inference"):
            check = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert check.status == health_pb2.HealthCheckResponse.NOT_SERVING
        with live.client() as c:
            assert c.get("/ready").status_code == 503


def test_a_backend_failure_is_internal_and_the_server_still_serves(
        serve: Callable[..., LiveServer]) -> None:
    live = serve(_config(models=[synth_chat(CHAT), synth_chat("flaky", fail_on_calls=[2])],
                         groups=[]))
    with grpc.insecure_channel(grpc_target(live)) as ch:
        f = _fails(lambda: _generate(ch, model="flaky", prompt="x", max_tokens=5))
        assert (f.code, f.reason) == (grpc.StatusCode.INTERNAL, "backend_error")
        assert "injected" not in f.message  # nothing internal leaks
        assert _generate(ch, model="flaky", prompt="y", max_tokens=3)[-1].done.usage


def test_every_sluice_code_has_a_status_and_the_docs_list_the_table() -> None:
    """Every rejection and terminal error sluice produces maps to a defined status (never
    UNKNOWN); docs/grpc.md shows each row of ``BY_CODE``."""
    codes = {**{c: s for c, (s, _) in REJECTION_STATUS.items()},
             **{c: s for c, (s, _, _) in FINAL_STATUS.items()}}
    for code, http in codes.items():
        assert status_code(APIError(http, "m", code=code)) != grpc.StatusCode.UNKNOWN, code
    for http in (400, 401, 403, 404, 409, 413, 429, 499, 500, 503, 504):
        assert status_code(APIError(http, "m")) != grpc.StatusCode.UNKNOWN, http
    docs = (ROOT / "docs" / "grpc.md").read_text()
    for code, status in BY_CODE.items():
        assert f"`{code}`" in docs and status.name in docs, code


# -- cancel, concurrency, health, reflection ---------------------------------------------


def test_cancel_mid_stream_cancels_the_request_and_frees_kv(
        serve: Callable[..., LiveServer]) -> None:
    live = serve(_config(models=[synth_chat(CHAT, step_fixed_s=0.01)], groups=[]))
    with grpc.insecure_channel(grpc_target(live)) as ch:
        call = stub(ch).Generate(pb.GenerateRequest(model=CHAT, prompt="x", max_tokens=400),
                                 timeout=30)
        got = [next(call) for _ in range(3)]
        assert all(m.WhichOneof("event") == "token" for m in got)
        with live.client() as c:
            assert metric_sum(scrape(c), "sluice_kv_blocks_used") > 0
            call.cancel()
            wait_for(lambda: metric_sum(scrape(c), "sluice_requests_total",
                                        state="cancelled") == 1)
            wait_for(lambda: metric_sum(scrape(c), "sluice_kv_blocks_used") == 0)
            assert metric_sum(scrape(c), "sluice_tokens_total", kind="completion") == 0
        assert _generate(ch, model=CHAT, prompt="after", max_tokens=2)[-1].done.usage


def test_64_concurrent_calls_get_ok_or_resource_exhausted_with_a_delay(
        serve: Callable[..., LiveServer]) -> None:
    live = serve(_config(models=[synth_chat(CHAT, step_fixed_s=0.01, n_seq_max=2)],
                         groups=[], scheduling={"queue_capacity": 4},
                         workers={"count": 1, "inbox_capacity": 2, "budget_bytes": 10**9}))

    async def one(s: inference_pb2_grpc.InferenceStub) -> tuple[grpc.StatusCode, Any]:
        try:
            out = [m async for m in s.Generate(pb.GenerateRequest(
                model=CHAT, prompt="load", max_tokens=8), timeout=60)]
            assert out[-1].done.usage.completion_tokens == 8
            return grpc.StatusCode.OK, None
        except grpc.aio.AioRpcError as err:
            return err.code(), failure(err)

    async def run() -> list[tuple[grpc.StatusCode, Any]]:
        async with grpc.aio.insecure_channel(grpc_target(live)) as ch:
            s = inference_pb2_grpc.InferenceStub(ch)
            return list(await asyncio.gather(*(one(s) for _ in range(64))))

    results = asyncio.run(run())
    codes = [code for code, _ in results]
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
    assert codes.count(grpc.StatusCode.OK) >= 4
    refused = [f for code, f in results if code == grpc.StatusCode.RESOURCE_EXHAUSTED]
    assert refused, "a queue of 4 took 64 calls at once"
    assert all(f.reason == "queue_full" and f.retry_delay_s and f.retry_delay_s > 0
               for f in refused), refused[:3]
    with grpc.insecure_channel(grpc_target(live)) as ch:
        assert _generate(ch, model=CHAT, prompt="after", max_tokens=2)[-1].done.usage


def test_health_follows_readiness(serve: Callable[..., LiveServer]) -> None:
    """SERVING exactly when /ready is 200: a default model that fails to load is
    NOT_SERVING (and /ready 503) from the start; Watch streams the drain."""
    broken = serve(_config(models=[synth_chat("broken", fail_load=True), synth_chat(CHAT)],
                           groups=[]))
    with grpc.insecure_channel(grpc_target(broken)) as ch, broken.client() as c:
        check = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert check.status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert c.get("/ready").status_code == 503
    live = serve(_config())
    with grpc.insecure_channel(grpc_target(live)) as ch, live.client() as c:
        health = health_pb2_grpc.HealthStub(ch)
        assert c.get("/ready").status_code == 200
        watch = health.Watch(health_pb2.HealthCheckRequest(service="sluice.v1.Inference"),
                             timeout=10)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        live.runtime.begin_drain()
        assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert c.get("/ready").status_code == 503
        watch.cancel()
        f = _fails(lambda: health.Check(health_pb2.HealthCheckRequest(service="nope"),
                                        timeout=5))
        assert f.code == grpc.StatusCode.NOT_FOUND


def test_reflection_describes_the_services(channel: grpc.Channel) -> None:
    db = ProtoReflectionDescriptorDatabase(channel)
    services = set(db.get_services())
    assert {"sluice.v1.Inference", "grpc.health.v1.Health"} <= services
    proto = db.FindFileContainingSymbol("sluice.v1.Inference")
    [service] = [s for s in proto.service if s.name == "Inference"]
    assert [m.name for m in service.method] == ["Generate", "Infer", "Embed", "ListModels"]
    assert [m.server_streaming for m in service.method] == [True, False, False, False]


def _strip_json_names(messages: Any) -> None:
    for message in messages:
        for field in message.field:
            field.ClearField("json_name")
        _strip_json_names(message.nested_type)


def test_generated_modules_match_the_proto() -> None:
    """The modules the build generated are current: protoc on the committed .proto gives
    the descriptor they carry (else: pip install -e . again)."""
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        assert protoc.main(["protoc", f"--proto_path={ROOT}", f"--descriptor_set_out={out}",
                            "sluice/v1/inference.proto"]) == 0
        fresh = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    _strip_json_names(fresh.message_type)  # the generated modules leave them out
    built = descriptor_pb2.FileDescriptorProto.FromString(pb.DESCRIPTOR.serialized_pb)
    assert built == fresh


def test_an_unexpected_error_is_internal_without_internals(
        live: LiveServer, channel: grpc.Channel, monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice.server.grpc import service

    def broken(ctx: Any) -> Any:
        raise RuntimeError("secret internals")

    monkeypatch.setattr(service, "model_list", broken)
    f = _fails(lambda: stub(channel).ListModels(pb.ListModelsRequest(), timeout=5))
    assert (f.code, f.reason, f.message) == (grpc.StatusCode.INTERNAL, "internal_error",
                                             "Internal error.")
