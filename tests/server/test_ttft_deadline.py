"""First-token deadlines over HTTP: from the header, the tenant's default or the model's;
a request predicted to miss its deadline is answered at once with 503
``deadline_infeasible`` and a computed Retry-After."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from sluice.policy.step.step_cost import StepCost
from tests.server.live import LiveServer, assert_error, config_with, synth_chat, wait_for


@pytest.fixture(scope="module")
def server(serve_module: Callable[..., LiveServer], tmp_path_factory: pytest.TempPathFactory
           ) -> LiveServer:
    """One sequence at a time, 20 ms a step; the step-time prior says exactly that."""
    prior = Path(tmp_path_factory.mktemp("cost")) / "cost.json"
    StepCost(0.020, 0.0005, 0.00005).save(prior)
    one_slot = {"step_fixed_s": 0.02, "n_seq_max": 1, "load_s": 0.0}
    return serve_module(config_with(
        models=[{**synth_chat("slow", **one_slot), "step_cost_file": str(prior)},
                {**synth_chat("slow-default", **one_slot), "step_cost_file": str(prior),
                 "ttft_deadline_ms": 500},
                {**synth_chat("slow-target", **one_slot), "step_cost_file": str(prior),
                 "tpot_target_ms": 100, "ttft_target_ms": 500}],
        workers={"count": 1, "inbox_capacity": 4},
        tenants=[{"id": "default"}, {"id": "eager", "default_ttft_deadline_ms": 500},
                 {"id": "keen", "default_ttft_target_ms": 500}],
    ))


@pytest.fixture
def client(server: LiveServer) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c
    wait_for(lambda: _idle(server))


def _idle(live: LiveServer) -> bool:
    with live.client() as c:
        s = c.get("/status.json").json()
    return s["live_requests"] == 0 and s["queue_depth"] == 0


def _body(model: str, max_new_tokens: int, **extra: object) -> dict[str, object]:
    return {"model": model, "input": "go", "max_new_tokens": max_new_tokens, **extra}


def test_a_feasible_first_token_deadline_is_served(client: httpx.Client) -> None:
    r = client.post("/v1/infer", json=_body("slow", 3),
                    headers={"x-sluice-ttft-deadline-ms": "500"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(("model", "headers"), [
    ("slow", {"x-sluice-ttft-deadline-ms": "500"}),
    ("slow", {"x-tenant-id": "eager"}),
    ("slow-default", {}),
])
def test_an_infeasible_one_is_refused_at_once_with_a_computed_retry_after(
        server: LiveServer, client: httpx.Client, model: str, headers: dict[str, str]) -> None:
    # The blocker holds the only slot for 150 steps of 20 ms (3 s).
    with server.client() as blocker_client, blocker_client.stream(
            "POST", "/v1/infer", json=_body(model, 150, stream=True)) as blocker:
        assert blocker.status_code == 200
        lines = blocker.iter_lines()
        next(lines)  # it runs
        r = client.post("/v1/infer", json=_body(model, 3), headers=headers)
        err = assert_error(r, 503, code="deadline_infeasible")
        assert "first-token deadline infeasible" in err["message"]
        # a slot frees in about 3 s; the deadline allows 0.5 s: retry in about 2.5 s
        assert 2 <= int(r.headers["retry-after"]) <= 4
        blocker.close()


def test_a_request_without_any_first_token_deadline_waits_its_turn(
        server: LiveServer, client: httpx.Client) -> None:
    with server.client() as blocker_client, blocker_client.stream(
            "POST", "/v1/infer", json=_body("slow", 20, stream=True)) as blocker:
        lines = blocker.iter_lines()  # kept: a collected iterator would hang the stream up
        next(lines)
        r = client.post("/v1/infer", json=_body("slow", 2))
        assert r.status_code == 200, r.text


@pytest.mark.parametrize(("model", "headers"), [
    ("slow", {"x-sluice-ttft-target-ms": "500"}),
    ("slow", {"x-tenant-id": "keen"}),
    ("slow-target", {}),
])
def test_a_request_that_would_miss_its_first_token_target_is_refused_with_a_retry_after(
        server: LiveServer, client: httpx.Client, model: str, headers: dict[str, str]) -> None:
    """A first-token target (soft) refuses like a deadline what no width can start in time
    (one slot, held 3 s); a request whose target allows the wait queues, is served, and
    the width decision it waited under is in ``/status.json``."""
    with server.client() as blocker_client, blocker_client.stream(
            "POST", "/v1/infer", json=_body(model, 150, stream=True),
            headers={"x-sluice-ttft-target-ms": "60000"}) as blocker:
        assert blocker.status_code == 200
        lines = blocker.iter_lines()  # kept: a collected iterator would hang the stream up
        next(lines)  # it runs
        r = client.post("/v1/infer", json=_body(model, 3), headers=headers)
        err = assert_error(r, 503, code="deadline_infeasible")
        assert "first-token target infeasible" in err["message"]
        assert 2 <= int(r.headers["retry-after"]) <= 4
        patient = client.post("/v1/infer", json=_body(model, 2),
                              headers={"x-sluice-ttft-target-ms": "60000"})
        assert patient.status_code == 200, patient.text
        blocker.close()
    if model == "slow-target":
        status = client.get("/status.json").json()
        entry = next(m for w in status["workers"] for m in w["models"]
                     if m["model_id"] == model)
        assert entry["width"]["reason"] == "tpot" and entry["width"]["concurrency"] == 1
