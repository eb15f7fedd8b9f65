"""The access log: one line per API request, HTTP or gRPC, with the request id the client
saw, tenant, model, variant, status, queue wait, TTFT, tokens and duration; prompt text only
with ``server.log_content``; ``sluice serve --log-format json`` writes every line as JSON."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sluice.v1 import inference_pb2 as pb
from tests.procs import free_port, start_serve
from tests.reliability.rawhttp import http_bytes, raw_request
from tests.server.grpcclient import grpc_target, stub
from tests.server.live import (
    SYNTHETIC_TOML,
    LiveServer,
    config_with,
    synth_chat,
    synth_embed,
    wait_for,
)

PROMPT = "a secret prompt about rivers"
FIELDS = {"request_id", "protocol", "method", "path", "status", "tenant", "model", "variant",
          "worker", "finish_reason", "error", "queue_wait_ms", "ttft_ms", "prompt_tokens",
          "completion_tokens", "duration_ms"}


def _config(**server: Any) -> Any:
    return config_with(
        models=[synth_chat("synth-chat"), synth_embed("synth-a")],
        tenants=[{"id": "acme", "api_keys": ["key-acme"],
                  "limits": {"requests_per_s": 0.1, "burst": 1}},
                 {"id": "beta", "api_keys": ["key-beta"]}],
        server={"grpc_port": 0, **server})


def _lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [{k: getattr(r, k) for k in FIELDS | {"prompt"} if hasattr(r, k)}
            for r in caplog.records if r.name == "sluice.access"]


def test_one_line_per_request_with_the_decision(serve: Callable[..., LiveServer],
                                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sluice.access")
    live = serve(_config())
    auth = {"authorization": "Bearer key-acme"}
    with live.client() as c:
        ok = c.post("/v1/completions", headers={**auth, "x-request-id": "req-one"},
                    json={"model": "synth-chat", "prompt": PROMPT, "max_tokens": 5})
        limited = c.post("/v1/embeddings", headers=auth, json={"model": "synth-a",
                                                                "input": "x"})
        # another tenant: acme, past its rate, is refused before its body is read
        missing = c.post("/v1/completions", headers={"authorization": "Bearer key-beta"},
                         json={"model": "nope", "prompt": "x"})
        c.get("/health")  # operational endpoints are not logged at INFO
    assert (ok.status_code, limited.status_code, missing.status_code) == (200, 429, 404)
    with grpc.insecure_channel(grpc_target(live)) as ch:
        out = list(stub(ch).Generate(pb.GenerateRequest(model="synth-chat", prompt=PROMPT,
                                                        max_tokens=3),
                                     metadata=[("authorization", "Bearer key-beta"),
                                               ("x-request-id", "grpc-one")], timeout=10))
    assert out[-1].done.usage.completion_tokens == 3

    lines = wait_for(lambda: (lambda got: got if len(got) >= 4 else None)(_lines(caplog)))
    assert len(lines) == 4, lines
    by_id = {line["request_id"]: line for line in lines}
    http = by_id["req-one"]
    assert set(http) == FIELDS
    assert (http["protocol"], http["method"], http["path"], http["status"]) == (
        "http", "POST", "/v1/completions", 200)
    assert (http["tenant"], http["model"], http["finish_reason"]) == ("acme", "synth-chat",
                                                                      "length")
    assert http["completion_tokens"] == 5 and http["prompt_tokens"] > 0
    assert http["queue_wait_ms"] >= 0 and 0 < http["ttft_ms"] <= http["duration_ms"]
    assert http["worker"] == 0
    [quota] = [x for x in lines if x["status"] == 429]
    # refused from its headers (acme's bucket was empty), so no model was read
    assert (quota["error"], quota["tenant"], quota["model"]) == ("quota", "acme", None)
    assert quota["request_id"] == limited.headers["x-request-id"]
    [nf] = [x for x in lines if x["status"] == 404]
    assert nf["model"] is None and nf["tenant"] is None  # refused before any request existed
    g = by_id["grpc-one"]
    assert (g["protocol"], g["path"], g["status"], g["completion_tokens"]) == (
        "grpc", "/sluice.v1.Inference/Generate", "OK", 3)
    assert (g["tenant"], g["model"]) == ("beta", "synth-chat")
    # No prompt text anywhere unless asked for.
    assert PROMPT not in caplog.text
    assert all("prompt" not in line for line in lines)


def test_prompt_text_only_with_log_content(serve: Callable[..., LiveServer],
                                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sluice.access")
    live = serve(_config(log_content=True))
    with live.client() as c:
        r = c.post("/v1/completions", headers={"authorization": "Bearer key-acme"},
                   json={"model": "synth-chat", "prompt": PROMPT, "max_tokens": 2})
    assert r.status_code == 200
    # The line is written once the response is sent: the client may read it first.
    [line] = wait_for(lambda: _lines(caplog))
    assert line["prompt"] == PROMPT


def test_serve_log_format_json_writes_json_lines() -> None:
    """``sluice serve --log-format json --grpc-port 0``: every line on stdout is one JSON
    object, a request's access line carries its fields as keys, the gRPC server answers
    health on the port it logged, and SIGTERM drains both to a clean exit."""
    cfg = Path(tempfile.mkdtemp()) / "sluice.toml"
    cfg.write_text(SYNTHETIC_TOML.read_text())
    port = free_port()
    proc = start_serve(cfg, port, extra_args=("--log-format", "json", "--log-level", "info",
                                              "--grpc-port", "0"))
    assert proc.stdout is not None
    early: list[str] = []
    try:
        while not any("serving gRPC on" in line for line in early):
            early.append(proc.stdout.readline().decode())
            assert len(early) < 50, early
        # "serving gRPC on 127.0.0.1 port 43521" (every --host address, one port)
        grpc_port = int(json.loads(early[-1])["message"].rsplit(" port ", 1)[1])
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as ch:
            check = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                         timeout=5)
        assert check.status == health_pb2.HealthCheckResponse.SERVING
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=10,
                       json={"model": "synth-chat", "prompt": "hello", "max_tokens": 3})
        assert r.status_code == 200
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    lines = [line for line in [*early, *out.decode().splitlines()] if line.strip()]
    parsed = [json.loads(line) for line in lines]  # each line is JSON
    assert all({"time", "level", "logger", "message"} <= set(p) for p in parsed)
    [access] = [p for p in parsed if p["logger"] == "sluice.access"]
    assert access["request_id"] == r.headers["x-request-id"]
    assert (access["status"], access["completion_tokens"], access["model"]) == (
        200, 3, "synth-chat")
    assert any(p["logger"].startswith("uvicorn") for p in parsed)


def test_control_characters_in_a_path_cannot_forge_a_text_line(
        serve: Callable[..., LiveServer], caplog: pytest.LogCaptureFixture) -> None:
    """A percent-encoded line break (or tab, or NEL) in the URL path is written escaped, in
    one quoted field of one line: nothing a client sends starts a line or adds a field."""
    caplog.set_level(logging.INFO, logger="sluice.access")
    live = serve(_config())
    forged = ("/v1/models%0d%0a2026-12-02 10:00:00,000 INFO sluice.access: request_id=forged"
              " status=200%09tenant=acme%C2%85x%E2%80%A8y").replace(" ", "%20")
    r = raw_request(live.url, http_bytes("GET", forged))
    assert r.status == 404
    with live.client(headers={"authorization": "Bearer key-beta"}) as c:
        ok = c.post("/v1/completions", json={"model": "synth-chat", "prompt": "hi",
                                             "max_tokens": 2})
        assert ok.status_code == 200, ok.text
    records = [r for r in caplog.records if r.name == "sluice.access"]
    hostile = next(r for r in records if getattr(r, "status", None) == 404)
    message = hostile.getMessage()
    assert message.isprintable(), repr(message)
    assert "\n" not in message and "\r" not in message and "\x85" not in message
    assert re.fullmatch(r'request_id=req-\w+ protocol=http method=GET path="(?:[^"\\]|\\.)*"'
                        r" status=404 duration_ms=[\d.]+", message), message
    assert ('path="/v1/models\\r\\n2026-12-02 10:00:00,000 INFO sluice.access: '
            'request_id=forged status=200\\ttenant=acme\\u0085x\\u2028y"') in message
    assert hostile.path.startswith("/v1/models\r\n")  # the JSON log keeps the value itself
    served = [r for r in records if getattr(r, "path", None) == "/v1/completions"]
    assert [r.status for r in served] == [200]
