"""Faults the server must survive, over HTTP: a backend that raises on load, mid-batch and
mid-decode; corrupt and truncated GGUF files; a load slower than the request's deadline;
and a client that disconnects while its request is queued, at the worker, in prefill or
in decode. After each: the right status, the other models and the worker keep serving,
and nothing is held (KV blocks, sequence slots, queue places)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.reliability.rawhttp import http_bytes
from tests.server.live import (
    LiveServer,
    assert_error,
    config_with,
    metric_sum,
    scrape,
    synth_chat,
    synth_embed,
    wait_for,
)


def integrity(live: LiveServer, worker: int = 0) -> dict[str, tuple[int, int]]:
    """The worker's own integrity check, run on its thread: raises on a violation."""
    w = live.runtime.workers[worker]
    state: dict[str, tuple[int, int]] = w.call(w.integrity).result(timeout=10)
    return state


def assert_idle_and_free(live: LiveServer, timeout_s: float = 5.0) -> None:
    def idle() -> bool:
        snap = live.runtime.snapshot()
        return (snap.live_requests == 0 and snap.queue_depth == 0
                and all(w.active_count == 0 for w in snap.workers)
                and not any(snap.inbox_depths))
    wait_for(idle, timeout_s=timeout_s)
    for i in range(len(live.runtime.workers)):
        assert all(free == total for free, total in integrity(live, i).values())


# -- backend raises on load ---------------------------------------------------------------


def test_load_failure_marks_the_model_failed_and_spares_the_others(
    serve: Callable[..., LiveServer],
) -> None:
    live = serve(config_with(
        models=[synth_chat("ok"), synth_chat("broken", fail_load=True), synth_embed("emb")],
        workers={"count": 1}, server={"default_model": "ok", "open_admin": True}))
    with live.client() as c:
        for _ in range(2):  # every try fails the same way; nothing sticks
            r = c.post("/v1/infer", json={"model": "broken", "input": "x"})
            err = assert_error(r, 503, code="model_load_failed", type="server_error")
            assert err["message"] == "The model could not be loaded."
        models = {m["id"]: m for m in c.get("/v1/models").json()["data"]}
        assert models["broken"]["status"] == "failed"
        assert models["ok"]["status"] == "available"
        assert "broken" in c.get("/status.json").json()["workers"][0]["failed_models"]
        assert metric_sum(scrape(c), "sluice_model_load_failures_total", model="broken") == 2
        assert c.post("/v1/infer", json={"model": "ok", "input": "x",
                                         "max_new_tokens": 3}).status_code == 200
        assert c.post("/v1/embeddings", json={"model": "emb", "input": "x"}).status_code == 200
        assert c.get("/ready").status_code == 200
        assert_error(c.post("/admin/models/broken/load"), 409, code="load_failed")
    assert_idle_and_free(live)


# -- backend raises mid-batch / mid-decode ------------------------------------------------


def test_fault_mid_decode_fails_that_step_and_the_worker_keeps_serving(
    serve: Callable[..., LiveServer],
) -> None:
    live = serve(config_with(
        models=[synth_chat("flaky", fail_on_calls=[6], step_fixed_s=0.01, load_s=0.0),
                synth_embed("emb-flaky", fail_on_calls=[1])],
        workers={"count": 1}))

    async def burst() -> list[httpx.Response]:
        async with live.async_client() as c:
            return list(await asyncio.gather(*(
                c.post("/v1/infer", json={"model": "flaky", "input": f"go {i}",
                                          "max_new_tokens": 20}) for i in range(3))))

    responses = asyncio.run(burst())
    statuses = sorted(r.status_code for r in responses)
    assert set(statuses) <= {200, 500} and 500 in statuses, statuses
    for r in responses:
        if r.status_code == 500:
            err = assert_error(r, 500, code="backend_error", type="server_error")
            assert err["message"] == "The model failed while running this request."
    with live.client() as c:
        # a one-shot batch of four inputs whose one backend call raises
        r = c.post("/v1/embeddings", json={"model": "emb-flaky", "input": ["a", "b", "c", "d"]})
        assert_error(r, 500, code="backend_error")
        assert c.post("/v1/embeddings", json={"model": "emb-flaky",
                                              "input": ["a", "b"]}).status_code == 200
        for i in range(3):  # the same worker goes on serving the generative model
            r = c.post("/v1/infer", json={"model": "flaky", "input": f"again {i}",
                                          "max_new_tokens": 5})
            assert r.status_code == 200, r.text
        samples = scrape(c)
    assert metric_sum(samples, "sluice_requests_total", state="failed",
                      model="flaky") == statuses.count(500)
    assert_idle_and_free(live)


# -- corrupt / truncated model files ------------------------------------------------------


def test_corrupt_and_truncated_gguf_are_clear_errors_and_nothing_else_breaks(
    serve: Callable[..., LiveServer], tmp_path: Path,
) -> None:
    pytest.importorskip("llama_cpp", reason="the llm extra is not installed")
    from sluice.backends.packaged import default_gguf_path

    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"GGUF" + b"\x00\xff" * 5000)
    truncated = tmp_path / "truncated.gguf"
    with default_gguf_path(progress=False).open("rb") as f:
        truncated.write_bytes(f.read(2**20))

    def gguf(model_id: str, path: Path) -> dict[str, Any]:
        return {"id": model_id, "kind": "generative", "backend": "llamacpp",
                "task": "generation", "memory_bytes": 100_000_000,
                "options": {"path": str(path), "n_ctx": 512, "n_seq_max": 1, "n_threads": 1}}

    live = serve(config_with(
        models=[synth_chat(), gguf("corrupt", garbage), gguf("truncated", truncated)],
        workers={"count": 1, "budget_bytes": 1_000_000_000},
        server={"default_model": "synth-chat", "open_admin": True}))
    with live.client() as c:
        assert c.get("/ready").status_code == 200  # the bad files did not stop start-up
        for model in ("corrupt", "truncated"):
            r = c.post("/v1/completions", json={"model": model, "prompt": "hi"})
            err = assert_error(r, 503, code="model_load_failed", type="server_error")
            assert str(tmp_path) not in err["message"]
            assert_error(c.post(f"/admin/models/{model}/load"), 409, code="load_failed")
        r = c.post("/v1/completions", json={"model": "synth-chat", "prompt": "hi",
                                            "max_tokens": 3})
        assert r.status_code == 200, r.text
        assert c.get("/health").status_code == 200
    assert_idle_and_free(live)


# -- a load slower than the deadline ------------------------------------------------------


def test_load_slower_than_the_deadline_expires_the_request_and_completes(
    serve: Callable[..., LiveServer],
) -> None:
    load_s = 1.5
    live = serve(config_with(
        models=[synth_chat("resident"), synth_chat("slow-load", load_s=load_s)],
        workers={"count": 1}, server={"default_model": "resident"}))
    with live.client() as c:
        t0 = time.monotonic()
        r = c.post("/v1/infer", json={"model": "slow-load", "input": "x", "max_new_tokens": 3,
                                      "deadline_ms": 300})
        elapsed = time.monotonic() - t0
        assert_error(r, 504, code="deadline", type="deadline_exceeded")
        # The worker thread is busy loading: the expiry is noticed when the load ends.
        assert elapsed < load_s + 2.0
        resident = c.get("/status.json").json()["workers"][0]["models"]
        assert "slow-load" in {m["model_id"] for m in resident}  # the load completed
        t0 = time.monotonic()
        r = c.post("/v1/infer", json={"model": "slow-load", "input": "x", "max_new_tokens": 3,
                                      "deadline_ms": 2000})
        assert r.status_code == 200, r.text
        assert time.monotonic() - t0 < 1.0  # no second load
        assert metric_sum(scrape(c), "sluice_model_loads_total", model="slow-load") == 1
    assert_idle_and_free(live)


# -- client disconnects at every stage ----------------------------------------------------

SLOW = "slow"


@pytest.fixture(scope="module")
def stage_server(serve_module: Callable[..., LiveServer]) -> LiveServer:
    """One sequence slot, one inbox place; 20 ms a decode step; prefill 10 ms a token in
    chunks of 32 (so a 300-token prompt prefills for about 3 s)."""
    return serve_module(config_with(
        models=[synth_chat(SLOW, n_seq_max=1, step_fixed_s=0.02, prefill_per_token_s=0.01,
                           load_s=0.0)],
        workers={"count": 1, "inbox_capacity": 1},
        scheduling={"queue_capacity": 8},
        engine={"prefill_chunk_tokens": 32},
    ))


def open_request(live: LiveServer, prompt_words: int = 2, max_new_tokens: int = 500,
                 stream: bool = True) -> socket.socket:
    """Send a request on a raw socket and leave it open (closing it = disconnecting)."""
    body = httpx.Request("POST", "/", json={
        "model": SLOW, "input": " ".join(["go"] * prompt_words),
        "max_new_tokens": max_new_tokens, "stream": stream}).read()
    host, port = live.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(http_bytes("POST", "/v1/infer", body, {"content-type": "application/json"}))
    return sock


def received(sock: socket.socket) -> bytes:
    sock.setblocking(False)
    try:
        return sock.recv(65536)
    except BlockingIOError:
        return b""
    finally:
        sock.setblocking(True)


def cancelled_total(live: LiveServer) -> float:
    with live.client() as c:
        return metric_sum(scrape(c), "sluice_requests_total", state="cancelled", model=SLOW)


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    yield opened
    for s in opened:
        s.close()


def snapshot(live: LiveServer) -> Any:
    return live.runtime.snapshot()


@pytest.mark.parametrize("stage", ["queued", "at_worker", "prefill", "decode"])
def test_disconnect_at_every_stage_frees_everything(
    stage_server: LiveServer, sockets: list[socket.socket], stage: str,
) -> None:
    live = stage_server
    before = cancelled_total(live)
    if stage in ("queued", "at_worker", "decode"):
        holder = open_request(live)  # takes the only sequence slot
        sockets.append(holder)
        wait_for(lambda: b"data:" in received(holder) or None, timeout_s=5)
    if stage in ("queued", "at_worker"):
        at_worker = open_request(live, stream=False)
        sockets.append(at_worker)
        wait_for(lambda: snapshot(live).inbox_depths[0] == 1)
    if stage == "queued":
        queued = open_request(live, stream=False)
        sockets.append(queued)
        wait_for(lambda: snapshot(live).queue_depth == 1)
    if stage == "prefill":
        prefilling = open_request(live, prompt_words=300, max_new_tokens=100)
        sockets.append(prefilling)
        wait_for(lambda: snapshot(live).workers[0].active_count == 1)
        time.sleep(0.3)
        assert received(prefilling) == b""  # nothing is sent before the first token
    target = sockets[-1]
    target.close()  # the client goes away at this stage
    wait_for(lambda: cancelled_total(live) == before + 1, timeout_s=3)
    # The worker republishes its inbox depth after the engine step in which the cancel
    # landed, so the depth is polled rather than read once.
    if stage == "queued":
        wait_for(lambda: snapshot(live).queue_depth == 0)
        assert snapshot(live).inbox_depths[0] == 1
    if stage == "at_worker":
        wait_for(lambda: snapshot(live).inbox_depths[0] == 0)
    for s in sockets[:-1]:
        s.close()
    wait_for(lambda: cancelled_total(live) == before + len(sockets), timeout_s=3)
    assert_idle_and_free(live)
    with live.client() as c:
        r = c.post("/v1/infer", json={"model": SLOW, "input": "go", "max_new_tokens": 2})
        assert r.status_code == 200, r.text


def test_a_request_never_completes_after_its_deadline(serve: Callable[..., LiveServer]) -> None:
    """Three 100 ms decode steps cannot fit a 250 ms deadline: the third pass ends past
    it, so its token is not delivered and the request ends 504, not a late 200."""
    live = serve(config_with(models=[synth_chat("steps", step_fixed_s=0.1, load_s=0.0)],
                             workers={"count": 1}))
    with live.client() as c:
        for path, body in (("/v1/infer", {"model": "steps", "input": "x",
                                          "max_new_tokens": 3, "deadline_ms": 250}),
                           ("/v1/completions", {"model": "steps", "prompt": "x",
                                                "max_tokens": 3, "deadline_ms": 250})):
            assert_error(c.post(path, json=body), 504, code="deadline")
        samples = scrape(c)
    assert metric_sum(samples, "sluice_requests_total", state="completed") == 0
    assert metric_sum(samples, "sluice_requests_total", state="expired") == 2
    assert_idle_and_free(live)
