"""Model lifecycle on the synthetic backend with an injected clock: keep-alive unloads,
per-request keep_alive, pins against eviction, and no request lost to an unload."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator

import pytest

from sluice.backends.base import ModelSpec
from sluice.backends.synthetic import SyntheticBackend
from sluice.engine.request import Final, Request, RequestStatus, SamplingParams
from sluice.engine.runtime import Runtime, RuntimeConfig
from sluice.engine.worker import ModelState
from sluice.policy.capacity.keep_alive import PINNED, KeepAlive
from sluice.policy.queues.control_core import QueueConfig
from sluice.policy.worker_config import WorkerConfig
from tests.engine.conftest import MB, generative, oneshot
from tests.engine.test_runtime import wait_for


class JumpClock:
    """Monotonic time plus an offset a test moves forward (``jump``)."""

    def __init__(self) -> None:
        self.offset_s = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset_s

    def jump(self, seconds: float) -> None:
        self.offset_s += seconds


@pytest.fixture
def clock() -> JumpClock:
    return JumpClock()


@pytest.fixture
def backend() -> SyntheticBackend:
    """The synthetic backend (it records every model it loads)."""
    return SyntheticBackend()


@pytest.fixture
def build(clock: JumpClock, backend: SyntheticBackend) -> Iterator[object]:
    made: list[Runtime] = []

    def make(models: list[ModelSpec], budget_mb: int = 1000) -> Runtime:
        config = RuntimeConfig(
            models=tuple(models),
            workers=(WorkerConfig(worker_id=0, budget_bytes=budget_mb * MB,
                                  inbox_capacity=64),),
            queue=QueueConfig(queue_capacity=256),
        )
        rt = Runtime(config, {"synthetic": backend}, clock=clock)
        rt.start()
        made.append(rt)
        return rt

    yield make
    for rt in made:
        rt.stop(drain_timeout_s=2.0)


def kept(spec: ModelSpec, idle_s: float | None = None, pinned: bool = False) -> ModelSpec:
    return dataclasses.replace(spec, keep_alive_s=idle_s, pinned=pinned)


def state_of(rt: Runtime, model_id: str) -> ModelState | None:
    return next((m for m in rt.workers[0].state.models if m.model_id == model_id), None)


def run(rt: Runtime, model_id: str, keep_alive: KeepAlive | None = None) -> Request:
    spec = rt.specs[model_id]
    if spec.kind == "generative":
        req = rt.new_request(model_id, prompt_tokens=(3, 4, 5), keep_alive=keep_alive,
                             params=SamplingParams(max_tokens=3, temperature=0.0))
    else:
        req = rt.new_request(model_id, input="x", keep_alive=keep_alive)
    assert rt.submit(req, timeout_s=5.0) is None
    wait_for(lambda: req.is_terminal)
    assert req.status == RequestStatus.COMPLETED, req.final
    return req


def test_an_idle_model_unloads_when_its_keep_alive_runs_out(build: object,
                                                            clock: JumpClock) -> None:
    rt = build([kept(generative("chat"), idle_s=300.0)])  # type: ignore[operator]
    run(rt, "chat")
    wait_for(lambda: (s := state_of(rt, "chat")) is not None and s.in_use == 0)
    state = state_of(rt, "chat")
    assert state is not None and state.keep_alive == "300s"
    assert state.expires_at_s is not None
    assert 299.0 < state.expires_at_s - rt.clock() <= 300.0
    clock.jump(200.0)
    rt.workers[0].wake()
    time.sleep(0.05)
    assert state_of(rt, "chat") is not None  # 100 s left
    clock.jump(101.0)
    rt.workers[0].wake()
    wait_for(lambda: state_of(rt, "chat") is None)
    run(rt, "chat")  # loads again on the next request
    assert state_of(rt, "chat") is not None


def test_a_request_keep_alive_of_zero_unloads_after_it(build: object) -> None:
    rt = build([kept(oneshot("enc"), idle_s=300.0)])  # type: ignore[operator]
    run(rt, "enc", keep_alive=KeepAlive(idle_s=0.0))
    wait_for(lambda: state_of(rt, "enc") is None)


def test_a_request_without_keep_alive_restores_the_configured_one(build: object) -> None:
    rt = build([kept(generative("chat"), idle_s=300.0)])  # type: ignore[operator]
    run(rt, "chat", keep_alive=KeepAlive(idle_s=30.0))
    wait_for(lambda: (s := state_of(rt, "chat")) is not None and s.keep_alive == "30s")
    run(rt, "chat")
    wait_for(lambda: (s := state_of(rt, "chat")) is not None and s.keep_alive == "300s")


def test_a_request_pin_keeps_the_model_past_any_idle_time(build: object,
                                                          clock: JumpClock) -> None:
    rt = build([kept(generative("chat"), idle_s=1.0)])  # type: ignore[operator]
    run(rt, "chat", keep_alive=PINNED)
    clock.jump(1e6)
    rt.workers[0].wake()
    time.sleep(0.05)
    state = state_of(rt, "chat")
    assert state is not None and state.keep_alive == "pinned" and state.expires_at_s is None


def test_eviction_passes_over_a_pinned_model(build: object) -> None:
    models = [kept(oneshot("pinned", memory_mb=60), pinned=True), oneshot("a", memory_mb=40),
              oneshot("b", memory_mb=40)]
    rt = build(models, budget_mb=100)  # type: ignore[operator]
    run(rt, "pinned")
    run(rt, "a")
    run(rt, "b")  # evicts a, never the (older, least recently used) pinned model
    resident = rt.workers[0].state.resident
    assert resident == {"pinned", "b"}


def test_a_model_that_cannot_fit_beside_the_pins_fails_with_the_reason(build: object) -> None:
    models = [kept(oneshot("pinned", memory_mb=60), pinned=True), oneshot("big", memory_mb=50)]
    rt = build(models, budget_mb=100)  # type: ignore[operator]
    run(rt, "pinned")
    req = rt.new_request("big", input="x")
    assert rt.submit(req, timeout_s=5.0) is None
    wait_for(lambda: req.is_terminal)
    assert req.status == RequestStatus.FAILED and req.final is not None
    assert req.final.error_code == "pinned_full"
    assert "pinned models hold" in (req.final.error or "")
    run(rt, "pinned")  # still serving


def test_requests_arriving_while_the_model_unloads_are_all_served(
        build: object, backend: SyntheticBackend) -> None:
    """keep_alive 0: the model unloads whenever it goes idle, while waves of requests keep
    arriving from several threads; every request ends in exactly one terminal state
    (completed), and the model did unload and reload in between."""
    rt = build([kept(generative("chat", load_s=0.002), idle_s=0.0)])  # type: ignore[operator]
    finals: dict[int, list[Final]] = {}
    reqs: list[Request] = []
    lock = threading.Lock()

    def client(n: int) -> None:
        for i in range(n):
            req = rt.new_request("chat", prompt_tokens=(3, 4, 5),
                                 params=SamplingParams(max_tokens=2, temperature=0.0))
            with lock:
                finals[req.request_id] = []
                reqs.append(req)
            req.listeners.append(lambda e, rid=req.request_id: finals[rid].append(e)
                                 if isinstance(e, Final) else None)
            assert rt.submit(req, timeout_s=5.0) is None
            if i % 3 == 0:
                wait_for(lambda r=req: r.is_terminal)  # let the model go idle now and then

    for _ in range(2):  # two rounds, the model unloaded in between (so it reloads once)
        threads = [threading.Thread(target=client, args=(8,)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30.0)
        wait_for(lambda: all(r.is_terminal for r in reqs), timeout_s=20.0)
        wait_for(lambda: state_of(rt, "chat") is None)
    assert len(reqs) == 64
    for req in reqs:
        assert len(finals[req.request_id]) == 1, "not exactly one terminal event"
        assert req.status == RequestStatus.COMPLETED, req.final
    assert len(backend.loads) > 1  # it did unload (and reload) while requests came
    wait_for(lambda: state_of(rt, "chat") is None)  # idle at the end: unloaded


def test_sequential_requests_with_keep_alive_zero_load_the_model_each_time(
        build: object, backend: SyntheticBackend) -> None:
    rt = build([kept(generative("chat"), idle_s=0.0)])  # type: ignore[operator]
    for _ in range(3):
        run(rt, "chat")
        wait_for(lambda: state_of(rt, "chat") is None)
    assert backend.loads == ["chat", "chat", "chat"]
