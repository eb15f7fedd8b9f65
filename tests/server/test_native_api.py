"""``/v1/infer``, the decision headers, deadlines and priority from headers, the
operations endpoints and admin load/unload, over HTTP with httpx."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.server.live import (
    LiveServer,
    assert_error,
    config_with,
    sse_data,
    synth_chat,
    synth_embed,
    wait_for,
)

CHAT = "synth-chat"
MESSAGES = [{"role": "user", "content": "what is a sluice"}]


# -- /v1/infer ----------------------------------------------------------------------------


def test_infer_one_shot_embedding(client: httpx.Client) -> None:
    r = client.post("/v1/infer", json={"model": "synth-a", "input": "hello"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "sluice.inference"
    assert body["model"] == "synth-a"
    assert body["id"].startswith("infer-")
    assert isinstance(body["output"], list) and len(body["output"]) == 16
    assert body["finish_reason"] == "stop"
    same = client.post("/v1/embeddings", json={"model": "synth-a", "input": "hello"}).json()
    assert body["output"] == same["data"][0]["embedding"]
    assert body["usage"]["prompt_tokens"] == same["usage"]["prompt_tokens"] == 2


def test_infer_one_shot_classification(client: httpx.Client) -> None:
    r = client.post("/v1/infer", json={"model": "synth-b", "input": "great product"})
    assert r.status_code == 200, r.text
    scores = r.json()["output"]
    assert set(scores) == {"negative", "positive"}
    assert sum(scores.values()) == pytest.approx(1.0, abs=1e-6)


def test_infer_generative_matches_chat(client: httpx.Client) -> None:
    """``input`` as messages renders like chat; /v1/infer is greedy by default."""
    r = client.post("/v1/infer", json={"model": CHAT, "input": MESSAGES, "max_new_tokens": 6})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 6
    chat = client.post("/v1/chat/completions", json={
        "model": CHAT, "messages": MESSAGES, "max_tokens": 6, "temperature": 0}).json()
    assert body["output"] == chat["choices"][0]["message"]["content"]
    # the same counts; chat's usage also carries OpenAI's prompt_tokens_details
    assert body["usage"] == {k: chat["usage"][k]
                             for k in ("prompt_tokens", "completion_tokens", "total_tokens")}


def test_infer_generative_text_input(client: httpx.Client) -> None:
    r = client.post("/v1/infer", json={"model": CHAT, "input": "a b c", "max_new_tokens": 3})
    assert r.status_code == 200, r.text
    assert r.json()["usage"] == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}


def test_infer_streaming(client: httpx.Client) -> None:
    payload = {"model": CHAT, "input": "stream me please", "max_new_tokens": 5}
    full = client.post("/v1/infer", json=payload).json()
    with client.stream("POST", "/v1/infer", json={**payload, "stream": True}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-request-id"]
        assert r.headers["x-sluice-worker"].isdigit()
        events = sse_data(r.iter_lines())
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    deltas = [c for c in chunks if "delta" in c and "finish_reason" not in c]
    assert "".join(c["delta"] for c in deltas) == full["output"]
    assert all(c["object"] == "sluice.inference.chunk" for c in deltas)
    end = next(c for c in chunks if "finish_reason" in c)
    assert end["finish_reason"] == "length"
    assert chunks[-1]["usage"] == full["usage"]


# -- request ids and decision headers -----------------------------------------------------


def test_request_id_on_every_response(client: httpx.Client) -> None:
    responses = [
        client.get("/health"),
        client.get("/ready"),
        client.get("/v1/models"),
        client.get("/metrics"),
        client.get("/status"),
        client.get("/status.json"),
        client.post("/v1/infer", json={"model": "synth-a", "input": "x"}),
        client.post("/v1/infer", json={"model": "nope", "input": "x"}),  # 404
        client.post("/v1/infer", content=b"{", headers={"content-type": "application/json"}),
        client.get("/no/such/path"),
        client.post("/v1/infer", content=b"x" * 2_000_000),  # 413
    ]
    ids = [r.headers.get("x-request-id") for r in responses]
    assert all(ids), [(r.status_code, r.url) for r in responses if not r.headers.get(
        "x-request-id")]
    assert len(set(ids)) == len(ids)
    assert [r.status_code for r in responses[-4:]] == [404, 400, 404, 413]


def test_request_id_is_echoed_when_well_formed(client: httpx.Client) -> None:
    r = client.post("/v1/infer", json={"model": "synth-a", "input": "x"},
                    headers={"x-request-id": "trace-42.a_b"})
    assert r.headers["x-request-id"] == "trace-42.a_b"
    r = client.get("/nope", headers={"x-request-id": "trace-43"})
    assert r.status_code == 404
    assert r.headers["x-request-id"] == "trace-43"
    bad = client.get("/health", headers={"x-request-id": "has space<script>"})
    assert bad.headers["x-request-id"].startswith("req-")


def test_decision_headers(client: httpx.Client, synthetic_server: LiveServer) -> None:
    n_workers = synthetic_server.config.workers.count
    for payload in ({"model": CHAT, "input": "x", "max_new_tokens": 2},
                    {"model": "synth-a", "input": "x"}):
        r = client.post("/v1/infer", json=payload, headers={"x-tenant-id": "team-7"})
        assert r.status_code == 200, r.text
        assert int(r.headers["x-sluice-worker"]) in range(n_workers)
        assert float(r.headers["x-sluice-queue-wait-ms"]) >= 0.0
        assert r.headers["x-sluice-tenant"] == "team-7"
        assert r.headers["x-sluice-request-id"].isdigit()
        assert r.headers["x-sluice-route"]
    r = client.post("/v1/chat/completions", json={"model": CHAT, "messages": MESSAGES,
                                                  "max_tokens": 1})
    assert r.headers["x-sluice-tenant"] == "default"
    assert r.json()["id"] == f"chatcmpl-{r.headers['x-sluice-request-id']}"


# -- deadlines and priority ---------------------------------------------------------------


@pytest.fixture(scope="module")
def slow_server(serve_module: Callable[..., LiveServer]) -> LiveServer:
    """One worker running one sequence at a time, 20 ms per decode step, priority_edf."""
    return serve_module(config_with(
        models=[synth_chat("slow", step_fixed_s=0.02, n_seq_max=1, load_s=0.0)],
        workers={"count": 1, "inbox_capacity": 1},
        scheduling={"scheduler": "priority_edf", "queue_capacity": 8},
        # Every tenant may ask for any priority (the default's ceiling is 0).
        tenants=[{"id": "default", "priority_ceiling": 0},
                 {"id": "hurried", "default_deadline_ms": 30, "priority_ceiling": 0}],
    ))


@pytest.fixture
def slow(slow_server: LiveServer) -> Iterator[httpx.Client]:
    with slow_server.client() as c:
        yield c
    wait_for(lambda: _idle(slow_server))


def _idle(live: LiveServer) -> bool:
    with live.client() as c:
        s = c.get("/status.json").json()
    return s["live_requests"] == 0 and s["queue_depth"] == 0


def _slow(max_new_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": "slow", "input": "go", "max_new_tokens": max_new_tokens, **extra}


def test_deadline_header_expires_running_request(slow: httpx.Client) -> None:
    # 50 steps of 20 ms cannot finish within 60 ms.
    r = slow.post("/v1/infer", json=_slow(50), headers={"x-sluice-deadline-ms": "60"})
    err = assert_error(r, 504, code="deadline", type="deadline_exceeded")
    assert "retry-after" not in r.headers
    assert r.headers["x-sluice-worker"] == "0"  # decision headers on errors too
    assert "deadline" in err["message"]


def test_deadline_passes_while_waiting_streaming_gets_504(slow_server: LiveServer,
                                                          slow: httpx.Client) -> None:
    with slow_server.client() as blocker_client, \
            blocker_client.stream("POST", "/v1/infer", json=_slow(500, stream=True)) as blocker:
        assert blocker.status_code == 200
        lines = blocker.iter_lines()  # keep it: a dropped iterator closes the response
        next(lines)  # the blocker now holds the only sequence slot
        r = slow.post("/v1/chat/completions", json={
            "model": "slow", "messages": MESSAGES, "max_tokens": 3, "stream": True,
            "deadline_ms": 100})
        assert r.headers["content-type"].startswith("application/json")
        assert_error(r, 504, code="deadline", type="deadline_exceeded")


def test_body_deadline_wins_over_header(slow: httpx.Client) -> None:
    r = slow.post("/v1/infer", json=_slow(3, deadline_ms=60_000),
                  headers={"x-sluice-deadline-ms": "1"})
    assert r.status_code == 200, r.text
    r = slow.post("/v1/infer", json=_slow(50, deadline_ms=40),
                  headers={"x-sluice-deadline-ms": "60000"})
    assert_error(r, 504, code="deadline")


def test_tenant_default_deadline_applies(slow: httpx.Client) -> None:
    r = slow.post("/v1/infer", json=_slow(50), headers={"x-tenant-id": "hurried"})
    assert_error(r, 504, code="deadline")
    assert r.headers["x-sluice-tenant"] == "hurried"
    # A header overrides the tenant's default.
    r = slow.post("/v1/infer", json=_slow(3), headers={"x-tenant-id": "hurried",
                                                       "x-sluice-deadline-ms": "60000"})
    assert r.status_code == 200, r.text


def _finish_order(live: LiveServer, arrivals: list[tuple[str, dict[str, str]]]
                  ) -> tuple[list[str], dict[str, httpx.Response]]:
    """Hold the only sequence slot with a streaming blocker, send ``arrivals`` in order
    (each waiting until the server has queued the previous one), release the blocker,
    and return the order in which they finished."""
    finished: list[str] = []
    responses: dict[str, httpx.Response] = {}
    lock = threading.Lock()

    def send(name: str, headers: dict[str, str]) -> None:
        with live.client() as c:
            r = c.post("/v1/infer", json=_slow(2), headers=headers)
        with lock:
            finished.append(name)
            responses[name] = r

    def waiting(c: httpx.Client) -> int:
        s = c.get("/status.json").json()
        return s["queue_depth"] + s["workers"][0]["inbox_depth"]  # type: ignore[no-any-return]

    with ThreadPoolExecutor(len(arrivals)) as pool, live.client() as c, \
            c.stream("POST", "/v1/infer", json=_slow(500, stream=True)) as blocker:
        lines = blocker.iter_lines()  # keep it: a dropped iterator closes the response
        next(lines)
        for i, (name, headers) in enumerate(arrivals, start=1):
            pool.submit(send, name, headers)
            wait_for(lambda i=i: waiting(c) == i)  # type: ignore[misc]
        blocker.close()  # cancels the blocker; the slot goes to the queued requests
        wait_for(lambda: len(finished) == len(arrivals), timeout_s=10)
    assert all(r.status_code == 200 for r in responses.values()), responses
    return finished, responses


def test_priority_header_orders_the_queue(slow_server: LiveServer, slow: httpx.Client) -> None:
    """priority_edf serves the smaller priority first: D (header 0) queued after C
    (tenant default 5) still runs before it, and E (9) goes last although it came
    second. B was already waiting at the worker, so it goes first."""
    order, responses = _finish_order(slow_server, [
        ("B", {"x-sluice-priority": "9"}),
        ("E", {"x-sluice-priority": "9"}),
        ("C", {}),
        ("D", {"x-sluice-priority": "0"}),
    ])
    assert order == ["B", "D", "C", "E"]
    assert (float(responses["C"].headers["x-sluice-queue-wait-ms"])
            > float(responses["D"].headers["x-sluice-queue-wait-ms"]))


def test_parked_request_does_not_jump_priority(slow_server: LiveServer,
                                               slow: httpx.Client) -> None:
    order, _ = _finish_order(slow_server, [
        ("B", {"x-sluice-priority": "9"}),
        ("C", {"x-sluice-priority": "9"}),
        ("D", {"x-sluice-priority": "0"}),
    ])
    assert order == ["B", "D", "C"]


# -- operations ---------------------------------------------------------------------------


def test_health_and_ready(client: httpx.Client) -> None:
    r = client.get("/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    r = client.get("/ready")
    assert r.status_code == 200 and r.json() == {"status": "ready", "model": CHAT}


def test_status_page_and_json(client: httpx.Client, synthetic_server: LiveServer) -> None:
    r = client.get("/status")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    assert "<title>sluice status</title>" in r.text
    assert "/status.json" in r.text
    client.post("/v1/infer", json={"model": CHAT, "input": "x", "max_new_tokens": 1})
    s = client.get("/status.json").json()
    assert s["queue_capacity"] == synthetic_server.config.scheduling.queue_capacity == 32
    assert s["scheduler"] == "fifo" and s["router"] == "residency_aware"
    assert s["draining"] is False
    assert [w["worker_id"] for w in s["workers"]] == [0, 1]
    for w in s["workers"]:
        assert w["budget_bytes"] == 800_000_000
        assert 0 <= w["resident_bytes"] <= w["budget_bytes"]
        assert w["resident_bytes"] == sum(m["memory_bytes"] for m in w["models"])
    chat = [m for w in s["workers"] for m in w["models"] if m["model_id"] == CHAT]
    assert chat and chat[0]["kv_total_blocks"] == 8 * 512 // 16


def test_ready_is_503_when_the_default_model_fails_to_load(
    serve: Callable[..., LiveServer],
) -> None:
    live = serve(config_with(models=[synth_chat("broken", fail_load=True), synth_embed()],
                             workers={"count": 1}))
    with live.client() as c:
        # the default model is loaded at start-up, so /ready knows at once
        r = c.get("/ready")
        assert r.status_code == 503
        assert r.json() == {"status": "failed", "model": "broken"}
        r = c.post("/v1/infer", json={"model": "broken", "input": "x", "max_new_tokens": 1})
        err = assert_error(r, 503, code="model_load_failed", type="server_error")
        assert "injected" not in err["message"]
        r = c.get("/ready")
        assert r.status_code == 503
        assert r.json() == {"status": "failed", "model": "broken"}
        models = {m["id"]: m for m in c.get("/v1/models").json()["data"]}
        assert models["broken"]["status"] == "failed"
        assert models["synth-a"]["status"] == "available"


def test_draining_refuses_new_work(serve: Callable[..., LiveServer]) -> None:
    live = serve(config_with(models=[synth_chat()], workers={"count": 1}))
    with live.client() as c:
        assert c.post("/v1/infer", json={"model": CHAT, "input": "x",
                                         "max_new_tokens": 1}).status_code == 200
        live.runtime.begin_drain()
        r = c.get("/ready")
        assert r.status_code == 503 and r.json() == {"status": "draining"}
        r = c.post("/v1/infer", json={"model": CHAT, "input": "x", "max_new_tokens": 1})
        assert_error(r, 503, code="draining", type="server_shutting_down")
        assert int(r.headers["retry-after"]) >= 1
        assert c.get("/health").status_code == 200


# -- admin --------------------------------------------------------------------------------


def _resident(c: httpx.Client) -> dict[str, bool]:
    return {m["id"]: m["resident"] for m in c.get("/v1/models").json()["data"]}


@pytest.mark.parametrize("path", [
    "/admin/models/..%2F..%2Fetc/load",
    "/admin/models/../../etc/load",
    "/admin/models/%2e%2e/load",
    "/admin/models/synth-a%00/load",
    "/admin/models/%2Fetc%2Fpasswd/unload",
])
def test_admin_path_traversal_is_refused_cleanly(client: httpx.Client, path: str) -> None:
    r = client.post(path)
    assert r.status_code in (400, 404), r.text
    assert_error(r, r.status_code)


def test_admin_load_and_unload_opened_for_development(
    serve: Callable[..., LiveServer],
) -> None:
    live = serve(config_with(models=[synth_chat(), synth_embed()], workers={"count": 2},
                             server={"open_admin": True}))
    with live.client() as c:
        assert _resident(c) == {CHAT: True, "synth-a": False}  # the default is preloaded
        r = c.post("/admin/models/synth-a/load")
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["model"] == "synth-a" and body["action"] == "load"
        assert body["results"] == [True]
        assert _resident(c)["synth-a"] is True
        r = c.post("/admin/models/synth-a/load")  # already resident: a no-op
        assert r.status_code == 200 and r.json()["results"] == [True]
        r = c.post("/admin/models/synth-a/unload")
        assert r.status_code == 200
        assert sorted(r.json()["results"]) == [False, True]  # one result per worker
        assert _resident(c)["synth-a"] is False
        assert_error(c.post("/admin/models/nope/load"), 404, code="model_not_found")
        assert_error(c.post("/admin/models/synth-a/reboot"), 400, param="path.action")
        assert c.get("/admin/models/synth-a/load").status_code == 405


def test_admin_with_key(serve: Callable[..., LiveServer]) -> None:
    live = serve(config_with(
        models=[synth_chat(), synth_embed(), synth_chat("broken", fail_load=True)],
        workers={"count": 1}, server={"admin_key": "s3cret"}))
    with live.client() as c:
        for headers in ({}, {"x-admin-key": "wrong"}, {"authorization": "Bearer wrong"},
                        {"authorization": "s3cret"}):
            r = c.post("/admin/models/synth-a/load", headers=headers)
            assert_error(r, 401, code="invalid_admin_key", type="authentication_error")
        # Without the key an unknown model is 401 too: nothing is revealed.
        assert_error(c.post("/admin/models/nope/load"), 401, code="invalid_admin_key")
        assert _resident(c)["synth-a"] is False
        r = c.post("/admin/models/synth-a/load", headers={"x-admin-key": "s3cret"})
        assert r.status_code == 200, r.text
        assert _resident(c)["synth-a"] is True
        r = c.post("/admin/models/synth-a/unload", headers={"authorization": "Bearer s3cret"})
        assert r.status_code == 200, r.text
        assert _resident(c)["synth-a"] is False
        r = c.post("/admin/models/nope/load", headers={"x-admin-key": "s3cret"})
        assert_error(r, 404, code="model_not_found")
        r = c.post("/admin/models/broken/load", headers={"x-admin-key": "s3cret"})
        assert_error(r, 409, code="load_failed")
        # The admin key is not an API key: ordinary routes stay open without tenants.
        r = c.post("/v1/infer", json={"model": "synth-a", "input": "x"})
        assert r.status_code == 200
