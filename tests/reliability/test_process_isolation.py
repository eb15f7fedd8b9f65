"""Process isolation (``workers.isolation = "process"``) over HTTP: a fault that really
ends a worker's process (``os.abort()``, SIGSEGV, SIGKILL from outside) fails the requests
it held with 500 ``worker_failed`` in each API's error shape, a replacement process loads
the model and serves it, and the other worker (its own process, its own model) serves on
unaffected; ``/health`` stays 200 throughout. Each worker holds one model (the budget
fits one), so the two models live on two processes."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

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

WARM_CALLS = 2
"""``forward`` calls of the faulty model's warm-up (one token) at most."""
KILL_CALL = 20
"""The faulty model's call that crashes its process: some steps into the burst (4 requests
of 40 tokens, 10 ms a step), when all four are in its engine and none has finished."""
RECOVER_S = 60.0
"""Bound on a replacement process's boot and load (a fresh interpreter on a busy host)."""


def _config(kill_mode: str, kill_on_calls: list[int]) -> Any:
    faulty = synth_chat("faulty", step_fixed_s=0.01)
    faulty["faults"] = {"kill_on_calls": kill_on_calls, "kill_mode": kill_mode}
    return config_with(models=[faulty, synth_chat("steady", step_fixed_s=0.01)],
                       workers={"count": 2, "budget_bytes": 150_000_000,
                                "isolation": "process"})


def _pids(live: LiveServer) -> dict[str, int]:
    """Each model's worker process id (the worker it is resident on)."""
    out = {}
    for w in live.runtime.workers:
        for m in w.state.resident:
            out[m] = w.pid
    return out


def _complete(c: httpx.Client, model: str, prompt: str,
              max_tokens: int = 8) -> httpx.Response:
    return c.post("/v1/completions", json={"model": model, "prompt": prompt,
                                           "max_tokens": max_tokens})


async def _during_death(live: LiveServer) -> tuple[list[httpx.Response], httpx.Response]:
    """Four requests to the faulty model (one API shape each) and one long one to the
    steady model, at once."""
    async with live.async_client() as c:
        faulty = [
            c.post("/v1/completions", json={"model": "faulty", "prompt": "a",
                                            "max_tokens": 40}),
            c.post("/v1/chat/completions", json={
                "model": "faulty", "max_tokens": 40,
                "messages": [{"role": "user", "content": "b"}]}),
            c.post("/v1/messages", json={
                "model": "faulty", "max_tokens": 40,
                "messages": [{"role": "user", "content": "c"}]}),
            c.post("/api/generate", json={"model": "faulty", "prompt": "d", "stream": False,
                                          "options": {"num_predict": 40}}),
        ]
        steady = c.post("/v1/completions", json={"model": "steady", "prompt": "s",
                                                 "max_tokens": 60})
        *dead, ok = await asyncio.gather(*faulty, steady)
    return dead, ok


def _assert_worker_failed(responses: list[httpx.Response]) -> None:
    """Each API's error shape, with ``worker_failed``."""
    openai_completion, openai_chat, anthropic, ollama = responses
    for r in (openai_completion, openai_chat):
        err = assert_error(r, 500, code="worker_failed", type="server_error")
        assert "replaced" in err["message"]
    assert anthropic.status_code == 500, anthropic.text
    body = anthropic.json()
    assert body["type"] == "error" and body["error"]["type"] == "api_error", body
    assert "replaced" in body["error"]["message"]
    assert ollama.status_code == 500, ollama.text
    assert "replaced" in ollama.json()["error"]


def _kill_and_recover(live: LiveServer, kill: Callable[[LiveServer], None],
                      signal_name: str) -> None:
    with live.client() as c:
        for model in ("faulty", "steady"):  # both resident, one per process
            assert _complete(c, model, "warm", max_tokens=1).status_code == 200
        assert live.runtime._faults["faulty"].calls <= WARM_CALLS
        pids = wait_for(lambda: len(_pids(live)) == 2 and _pids(live), timeout_s=10)
        assert pids["faulty"] != pids["steady"]
    kill(live)
    dead, ok = asyncio.run(_during_death(live))
    _assert_worker_failed(dead)
    assert ok.status_code == 200, ok.text  # the other process went on serving
    assert ok.json()["usage"]["completion_tokens"] > 0
    with live.client() as c:
        assert c.get("/health").status_code == 200
        wait_for(lambda: c.get("/ready").status_code == 200, timeout_s=RECOVER_S,
                 every_s=0.1)
        r = _complete(c, "faulty", "after")  # a real request on the replacement
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"]
        now = _pids(live)
        assert now["steady"] == pids["steady"]
        assert now["faulty"] != pids["faulty"]
        status = c.get("/status.json").json()
        s = scrape(c)
    [recovery] = status["recoveries"]
    assert recovery["models"] == ["faulty"] and recovery["failed_requests"] == 4
    assert signal_name in recovery["cause"], recovery
    assert metric_sum(s, "sluice_worker_deaths_total", cause="died") == 1
    assert metric_sum(s, "sluice_worker_failed_requests_total") == 4


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("mode", "signal_name"), [("abort", "SIGABRT"), ("segv", "SIGSEGV")])
def test_a_crash_in_a_worker_process_fails_its_requests_and_it_is_replaced(
    serve: Callable[..., LiveServer], mode: str, signal_name: str,
) -> None:
    # The call counter spans the processes, so the replacement is not killed again.
    live = serve(_config(mode, [KILL_CALL]))
    _kill_and_recover(live, lambda _: time.sleep(0), signal_name)


@pytest.mark.timeout(180)
def test_a_worker_process_killed_from_outside_is_replaced(
    serve: Callable[..., LiveServer],
) -> None:
    live = serve(_config("raise", []))

    def sigkill_mid_burst(live: LiveServer) -> None:
        worker = next(w for w in live.runtime.workers if "faulty" in w.state.resident)

        def later() -> None:  # once the burst is running on it
            wait_for(lambda: worker.state.active_count >= 4, timeout_s=20, every_s=0.005)
            os.kill(worker.pid, signal.SIGKILL)

        threading.Thread(target=later, daemon=True).start()

    _kill_and_recover(live, sigkill_mid_burst, "SIGKILL")


@pytest.mark.timeout(180)
def test_a_worker_process_that_hangs_is_killed_and_replaced(
    serve: Callable[..., LiveServer],
) -> None:
    """The heartbeat crosses the pipe: a child stuck in ``forward`` is declared stalled
    within the watchdog, its requests fail, and its process is killed (a stuck thread
    could only be left behind)."""
    faulty = synth_chat("faulty", step_fixed_s=0.01)
    faulty["faults"] = {"hang_on_calls": [KILL_CALL], "hang_s": 60.0}
    live = serve(config_with(models=[faulty, synth_chat("steady", step_fixed_s=0.01)],
                             workers={"count": 2, "budget_bytes": 150_000_000,
                                      "isolation": "process", "watchdog_s": 1.0}))
    with live.client() as c:
        for model in ("faulty", "steady"):
            assert _complete(c, model, "warm", max_tokens=1).status_code == 200
        pids = wait_for(lambda: len(_pids(live)) == 2 and _pids(live), timeout_s=10)
    t0 = time.monotonic()
    dead, ok = asyncio.run(_during_death(live))
    assert time.monotonic() - t0 < 30  # ended by the watchdog, not by the 60 s hang
    _assert_worker_failed(dead)
    assert "stopped making progress" in dead[0].json()["error"]["message"]
    assert ok.status_code == 200, ok.text
    wait_for(lambda: not os.path.exists(f"/proc/{pids['faulty']}"), timeout_s=10)
    with live.client() as c:
        wait_for(lambda: c.get("/ready").status_code == 200, timeout_s=RECOVER_S,
                 every_s=0.1)
        assert _complete(c, "faulty", "after").status_code == 200
        assert _pids(live)["steady"] == pids["steady"]
        [recovery] = c.get("/status.json").json()["recoveries"]
    assert recovery["cause"].startswith("stopped making progress"), recovery


def test_embeddings_cross_the_process_boundary_with_their_token_counts(
    serve: Callable[..., LiveServer],
) -> None:
    """An embedding model in a worker process: its results (vector and tokens read) come
    back through the pipe, and usage is the model's count (BOS and words), summed."""
    live = serve(config_with(models=[synth_embed("emb")],
                             workers={"count": 1, "isolation": "process"}))
    with live.client() as c:
        r = c.post("/v1/embeddings", json={"model": "emb", "input": ["one", "two words"]})
    assert r.status_code == 200, r.text
    assert [len(d["embedding"]) for d in r.json()["data"]] == [16, 16]
    assert r.json()["usage"] == {"prompt_tokens": 2 + 3, "total_tokens": 2 + 3}
