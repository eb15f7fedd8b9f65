"""Worker supervision over HTTP, with injected faults: a worker whose thread dies and one
that hangs in ``forward`` (or ``run_batch``). The requests it held fail at once (500
``worker_failed``), ``/ready`` and ``sluice_worker_up`` drop until a replacement has loaded
the dead worker's models, the replacement serves, ``/health`` stays 200 (a replacement is
on the way), and the counts on ``/metrics`` add up with what the clients saw."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.reliability.test_faults import assert_idle_and_free
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

LOAD_S = 1.0
"""Each load of the faulty model: long enough to see the recovery window from a client."""
HANG_S = 20.0
"""An injected hang; the watchdog must end the requests long before it ends."""


def faulty(model_id: str, load_s: float = LOAD_S, **faults: Any) -> dict[str, Any]:
    entry = synth_chat(model_id, load_s=load_s, step_fixed_s=0.005)
    entry["faults"] = faults
    return entry


async def _burst(live: LiveServer, model: str, n: int) -> list[httpx.Response]:
    async with live.async_client() as c:
        return list(await asyncio.gather(*(
            c.post("/v1/completions", json={"model": model, "prompt": f"go {i}",
                                            "max_tokens": 30}) for i in range(n))))


def _up(live: LiveServer, worker: str = "0") -> float:
    with live.client() as c:
        return metric_sum(scrape(c), "sluice_worker_up", worker=worker)


def _check_death_and_recovery(live: LiveServer, model: str, cause: str,
                              responses: list[httpx.Response], elapsed_s: float) -> None:
    """What every death must show: failed fast, readiness down then up, counts add up."""
    failed = [r for r in responses if r.status_code == 500]
    assert failed, [r.status_code for r in responses]
    assert all(r.status_code in (200, 500) for r in responses)
    for r in failed:
        err = assert_error(r, 500, code="worker_failed", type="server_error")
        assert "worker 0" in err["message"] and "replaced" in err["message"]
    assert elapsed_s < HANG_S  # ended by the supervisor, not by the fault running out
    with live.client() as c:
        # The replacement is still loading (LOAD_S): not ready, not up, but alive.
        ready = c.get("/ready")
        assert ready.status_code == 503, ready.text
        assert ready.json()["status"] == "recovering"
        assert c.get("/health").status_code == 200
        assert _up(live) == 0
        wait_for(lambda: c.get("/ready").status_code == 200, timeout_s=10)
        assert _up(live) == 1
        for i in range(3):  # the replacement serves the same model
            r = c.post("/v1/completions", json={"model": model, "prompt": f"after {i}",
                                                "max_tokens": 5})
            assert r.status_code == 200, r.text
        s = scrape(c)
    assert metric_sum(s, "sluice_worker_deaths_total", worker="0", cause=cause) == 1
    assert metric_sum(s, "sluice_worker_failed_requests_total") == len(failed)
    assert metric_sum(s, "sluice_requests_total", state="failed") == len(failed)
    assert metric_sum(s, "sluice_requests_total", state="completed") == (
        len(responses) - len(failed) + 3)
    assert metric_sum(s, "sluice_worker_recovery_seconds_count") == 1
    assert metric_sum(s, "sluice_worker_recovery_seconds_sum") >= LOAD_S
    with live.client() as c:
        status = c.get("/status.json").json()
    [recovery] = status["recoveries"]
    assert (recovery["worker_id"], recovery["failed_requests"], recovery["models"]) == (
        0, len(failed), [model])
    assert recovery["recovery_s"] >= LOAD_S and recovery["cause"].startswith(
        "died" if cause == "died" else "stopped making progress")
    assert status["workers"][0]["status"] == "up"
    assert_idle_and_free(live)


def test_a_worker_whose_thread_dies_is_replaced(serve: Callable[..., LiveServer]) -> None:
    live = serve(config_with(models=[faulty("dies", kill_on_calls=[4])],
                             workers={"count": 1}))
    t0 = time.monotonic()
    responses = asyncio.run(_burst(live, "dies", 4))
    elapsed = time.monotonic() - t0
    assert all(r.status_code == 500 for r in responses)  # all four were in that batch
    _check_death_and_recovery(live, "dies", "died", responses, elapsed)


def test_a_worker_that_hangs_in_forward_is_replaced(
    serve: Callable[..., LiveServer],
) -> None:
    live = serve(config_with(
        models=[faulty("hangs", hang_on_calls=[4], hang_s=HANG_S)],
        workers={"count": 1, "watchdog_s": 0.5}))
    t0 = time.monotonic()
    responses = asyncio.run(_burst(live, "hangs", 4))
    elapsed = time.monotonic() - t0
    _check_death_and_recovery(live, "hangs", "stalled", responses, elapsed)
    message = responses[0].json()["error"]["message"]
    assert "stopped making progress" in message


def test_a_one_shot_worker_that_dies_mid_batch_is_replaced(
    serve: Callable[..., LiveServer],
) -> None:
    emb = synth_embed("emb", load_s=LOAD_S)
    emb["faults"] = {"kill_on_calls": [2]}
    live = serve(config_with(models=[emb], workers={"count": 1}))
    with live.client() as c:
        assert c.post("/v1/embeddings", json={"model": "emb", "input": "a"}).status_code == 200
        r = c.post("/v1/embeddings", json={"model": "emb", "input": ["a", "b", "c"]})
        assert_error(r, 500, code="worker_failed")
        ready = c.get("/ready")
        assert ready.status_code == 503, (ready.text, live.runtime.recoveries())
        wait_for(lambda: c.get("/ready").status_code == 200, timeout_s=10)
        assert c.post("/v1/embeddings", json={"model": "emb", "input": ["x", "y"]}
                      ).status_code == 200
        s = scrape(c)
    assert metric_sum(s, "sluice_worker_deaths_total", cause="died") == 1
    # one request per input: the three of the batch failed, 1 + 2 completed
    assert metric_sum(s, "sluice_requests_total", state="failed") == 3
    assert metric_sum(s, "sluice_worker_failed_requests_total") == 3
    assert metric_sum(s, "sluice_requests_total", state="completed") == 3


def test_the_other_workers_serve_while_one_is_replaced(
    serve: Callable[..., LiveServer],
) -> None:
    """Two workers, the faulty model on worker 0 only: requests for a healthy model on
    worker 1 are served throughout, and the dead worker's slot comes back."""
    live = serve(config_with(
        models=[faulty("dies", kill_on_calls=[2], load_s=2.0), synth_chat("healthy")],
        workers={"count": 2, "budget_bytes": 100_000_000},
        scheduling={"router": "residency_aware"},
        server={"default_model": "dies", "open_admin": True}))
    with live.client() as c:
        assert c.post("/admin/models/healthy/load").status_code == 200
        r = c.post("/v1/completions", json={"model": "dies", "prompt": "x", "max_tokens": 3})
        dead = r.headers["x-sluice-worker"]
        assert assert_error(r, 500, code="worker_failed")["message"].startswith(
            f"worker {dead} died")
        assert c.get("/ready").json()["status"] == "recovering"
        r = c.post("/v1/completions", json={"model": "healthy", "prompt": "x",
                                            "max_tokens": 3})
        assert r.status_code == 200 and r.headers["x-sluice-worker"] != dead, r.text
        wait_for(lambda: c.get("/ready").status_code == 200, timeout_s=10)
        assert {m: _up(live, m) for m in ("0", "1")} == {"0": 1, "1": 1}


def test_health_fails_when_a_worker_is_dead_and_not_replaced(
    serve: Callable[..., LiveServer],
) -> None:
    live = serve(config_with(models=[synth_chat()], workers={"count": 2}))
    with live.client() as c:
        assert c.get("/health").json() == {"status": "ok"}
        worker = live.runtime.workers[1]
        worker.stop()  # not through the runtime: nothing replaces it
        worker.join(5.0)
        r = c.get("/health")
        assert r.status_code == 503
        assert r.json() == {"status": "dead",
                            "reason": "worker 1 is stopped and not being replaced"}
        assert c.get("/ready").status_code == 503


def test_health_fails_when_the_dispatcher_dies_and_queued_requests_end(
    serve: Callable[..., LiveServer], monkeypatch: pytest.MonkeyPatch,
) -> None:
    live = serve(config_with(models=[synth_chat()], workers={"count": 1}))
    runtime = live.runtime

    def broken(*_: Any) -> Any:
        raise RuntimeError("injected dispatcher bug")

    monkeypatch.setattr(runtime._router, "route", broken)
    with live.client() as c:
        r = c.post("/v1/completions", json={"model": "synth-chat", "prompt": "x",
                                            "max_tokens": 3})
        assert_error(r, 500, code="internal_error")
        health = c.get("/health")
        assert health.status_code == 503
        assert health.json()["reason"] == "dispatcher thread is dead (RuntimeError)"
        assert c.get("/ready").status_code == 503
        r = c.post("/v1/completions", json={"model": "synth-chat", "prompt": "x"})
        assert r.status_code == 503  # refused at once, never left to hang


def test_grpc_health_follows_readiness_through_a_recovery(
    serve: Callable[..., LiveServer],
) -> None:
    grpc = pytest.importorskip("grpc")
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from tests.server.grpcclient import grpc_target

    live = serve(config_with(models=[faulty("dies", kill_on_calls=[2])],
                             workers={"count": 1}, server={"grpc_port": 0}))
    serving = health_pb2.HealthCheckResponse.SERVING
    with grpc.insecure_channel(grpc_target(live)) as ch, live.client() as c:
        health = health_pb2_grpc.HealthStub(ch)

        def check() -> Any:
            return health.Check(health_pb2.HealthCheckRequest(), timeout=5).status

        assert check() == serving
        r = c.post("/v1/completions", json={"model": "dies", "prompt": "x", "max_tokens": 3})
        assert_error(r, 500, code="worker_failed")
        assert check() == health_pb2.HealthCheckResponse.NOT_SERVING
        wait_for(lambda: check() == serving, timeout_s=10)
        assert c.get("/ready").status_code == 200


def test_a_fresh_models_slow_first_step_is_not_a_stall(
    serve: Callable[..., LiveServer],
) -> None:
    """llama.cpp sets up its buffers in a fresh context's first pass (seconds): that pass
    gets the load allowance, not the step watchdog, so a replacement is not replaced."""
    live = serve(config_with(models=[faulty("slow-start", load_s=0.0, hang_on_calls=[1],
                                            hang_s=1.0)],
                             workers={"count": 1, "watchdog_s": 0.2}))
    with live.client() as c:
        r = c.post("/v1/completions", json={"model": "slow-start", "prompt": "x",
                                            "max_tokens": 3})
        assert r.status_code == 200, r.text
        assert metric_sum(scrape(c), "sluice_worker_deaths_total") == 0
