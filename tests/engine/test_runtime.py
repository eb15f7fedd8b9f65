"""The runtime with real threads on the synthetic backend."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import pytest

from sluice.engine.continuous import EngineConfig
from sluice.engine.request import Final, Request, RequestStatus, SamplingParams
from sluice.engine.runtime import Rejected, Runtime
from sluice.policy.step.tpot_margin import DEFAULT_MARGIN, MARGIN_CAP, MARGIN_FLOOR, MarginState
from tests.engine.conftest import generative, oneshot


def wait_for(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not reached in time")
        time.sleep(0.005)


def gen_request(rt: Runtime, max_tokens: int = 4, **kw: Any) -> Request:
    return rt.new_request("chat", prompt_tokens=(5, 6, 7),
                          params=SamplingParams(max_tokens=max_tokens, temperature=0.0), **kw)


def test_async_api_streams_tokens_and_returns_the_final(runtime_factory: Any) -> None:
    rt = runtime_factory([generative()])

    async def go() -> tuple[list[str], Final]:
        handle = await rt.generate("chat", "hello there", max_tokens=5, temperature=0)
        pieces = [p async for p in handle.tokens()]
        assert handle.final is not None
        return pieces, handle.final

    pieces, final = asyncio.run(go())
    assert len(pieces) == 5 and "".join(pieces) == final.text
    assert final.finish_reason == "length" and final.completion_tokens == 5


def test_try_submit_rejects_when_the_queue_is_full(runtime_factory: Any) -> None:
    slow = generative(step_fixed_s=0.05, n_seq_max=1)
    rt = runtime_factory([slow], inbox=1, queue=2)
    reqs = [gen_request(rt, max_tokens=20) for _ in range(6)]
    results = [rt.try_submit(r) for r in reqs]
    rejected = [r for r in results if r is not None]
    assert rejected and all(r.reason == "queue_full" for r in rejected)
    assert all(r.retry_after_s >= 1.0 for r in rejected)
    for r, res in zip(reqs, results, strict=True):
        if res is not None:
            assert r.status == RequestStatus.REJECTED
    assert rt.snapshot().queue_depth <= 2


def test_blocking_submit_waits_for_room(runtime_factory: Any) -> None:
    rt = runtime_factory([generative(step_fixed_s=0.005, n_seq_max=1)], inbox=1, queue=1)
    reqs = [gen_request(rt, max_tokens=3) for _ in range(5)]
    assert all(rt.submit(r, timeout_s=10.0) is None for r in reqs)
    wait_for(lambda: all(r.is_terminal for r in reqs))
    assert all(r.status == RequestStatus.COMPLETED for r in reqs)


def test_cancel_queued_and_running(runtime_factory: Any) -> None:
    rt = runtime_factory([generative(step_fixed_s=0.02, n_seq_max=1)], inbox=1, queue=8)
    running, inbox, queued = (gen_request(rt, max_tokens=120) for _ in range(3))
    for r in (running, inbox, queued):
        assert rt.try_submit(r) is None
    wait_for(lambda: running.status == RequestStatus.RUNNING)
    assert rt.cancel(queued.request_id)
    assert queued.status == RequestStatus.CANCELLED and queued.times.started_s is None
    assert rt.cancel(running.request_id)
    wait_for(lambda: running.status == RequestStatus.CANCELLED)
    wait_for(lambda: inbox.status == RequestStatus.RUNNING)
    assert rt.cancel(inbox.request_id)
    wait_for(lambda: inbox.is_terminal)
    assert not rt.cancel(inbox.request_id)
    wait_for(lambda: rt.snapshot().workers[0].active_count == 0)


def test_deadlines_expire_queued_without_running_and_stop_running(runtime_factory: Any) -> None:
    rt = runtime_factory([generative(step_fixed_s=0.02, n_seq_max=1)], inbox=1, queue=8)
    now = rt.clock()
    runner = gen_request(rt, max_tokens=120, deadline_s=now + 0.3)
    filler = gen_request(rt, max_tokens=120)  # holds the single inbox slot
    queued = gen_request(rt, max_tokens=5, deadline_s=now + 0.1)
    for r in (runner, filler, queued):
        assert rt.try_submit(r) is None
    wait_for(lambda: queued.is_terminal and runner.is_terminal)
    assert queued.status == RequestStatus.EXPIRED and queued.times.started_s is None
    assert runner.status == RequestStatus.EXPIRED and runner.times.started_s is not None
    assert runner.final is not None and runner.final.error_code == "deadline"


def test_backend_fault_fails_the_batch_and_the_worker_lives(runtime_factory: Any) -> None:
    rt = runtime_factory([oneshot("enc", fail_on_calls=[1])], max_wait_s=0.05)

    async def go() -> tuple[list[Final], Final]:
        first = await asyncio.gather(*(rt.infer("enc", f"t{i}") for i in range(3)))
        later = await rt.infer("enc", "after")
        return list(first), later

    first, later = asyncio.run(go())
    assert all(f.status == RequestStatus.FAILED and f.error_code == "backend_error"
               for f in first)
    assert later.status == RequestStatus.COMPLETED


def test_load_failure_fails_that_models_requests_only(runtime_factory: Any) -> None:
    rt = runtime_factory([oneshot("broken", fail_load=True), oneshot("ok")])

    async def go() -> tuple[Final, Final]:
        return await rt.infer("broken", "x"), await rt.infer("ok", "y")

    broken, ok = asyncio.run(go())
    assert broken.status == RequestStatus.FAILED and broken.error_code == "model_load_failed"
    assert ok.status == RequestStatus.COMPLETED
    assert "broken" in rt.snapshot().workers[0].failed_models


def test_eviction_under_a_small_budget(runtime_factory: Any) -> None:
    models = [oneshot("a", 300), oneshot("b", 300), generative("chat", 500)]
    rt = runtime_factory(models, workers=1, budget_mb=800)

    async def go() -> None:
        for model_id in ("a", "b", "a"):
            assert (await rt.infer(model_id, "x")).status == RequestStatus.COMPLETED
        handle = await rt.generate("chat", "hi", max_tokens=3)
        assert (await handle.result()).status == RequestStatus.COMPLETED

    asyncio.run(go())
    state = rt.snapshot().workers[0]
    assert state.resident_bytes <= 800_000_000
    assert "chat" in state.resident


def test_dynamic_batches_group_contiguous_same_model(runtime_factory: Any) -> None:
    rt = runtime_factory([oneshot("a"), oneshot("b")], start=False, max_batch=8, max_wait_s=0.05)
    rt.workers[0].trace = []
    rt.start()

    async def go() -> None:
        await asyncio.gather(*(rt.infer(m, "x") for m in ["a", "a", "a", "b", "a"]))

    asyncio.run(go())
    batches = [ids for what, ids in rt.workers[0].trace if what == "batch"]
    assert sorted(len(b) for b in batches) == [1, 1, 3]


def test_rejected_open_raises_and_ends_rejected(runtime_factory: Any) -> None:
    rt = runtime_factory([generative(step_fixed_s=0.05, n_seq_max=1)], inbox=1, queue=1)

    async def go() -> list[BaseException | None]:
        out: list[BaseException | None] = []
        for _ in range(5):
            try:
                rt.open(gen_request(rt, max_tokens=50))
                out.append(None)
            except Rejected as exc:
                out.append(exc)
        return out

    outcomes = asyncio.run(go())
    assert any(isinstance(o, Rejected) for o in outcomes)


def test_stop_drains_then_cancels_what_is_left(runtime_factory: Any) -> None:
    rt = runtime_factory([generative(step_fixed_s=0.01, n_seq_max=2)], inbox=2, queue=16)
    short = [gen_request(rt, max_tokens=3) for _ in range(2)]
    long_ = [gen_request(rt, max_tokens=10_000 // 100) for _ in range(2)]
    queued = [gen_request(rt, max_tokens=100) for _ in range(4)]
    for r in short + long_ + queued:
        assert rt.try_submit(r) is None
    cancelled = rt.stop(drain_timeout_s=0.3)
    assert cancelled > 0
    everything = short + long_ + queued
    assert all(r.is_terminal for r in everything)
    assert all(r.status == RequestStatus.COMPLETED for r in short)
    assert {r.status for r in everything} <= {RequestStatus.COMPLETED, RequestStatus.CANCELLED}
    late = gen_request(rt)
    rejection = rt.try_submit(late)
    assert rejection is not None and rejection.reason == "draining"


def test_static_and_serial_modes_complete_everything(runtime_factory: Any) -> None:
    for mode in ("static", "serial"):
        rt = runtime_factory([generative()], engine=EngineConfig(mode=mode))
        reqs = [gen_request(rt, max_tokens=4) for _ in range(6)]
        for r in reqs:
            assert rt.try_submit(r) is None
        wait_for(lambda reqs=reqs: all(r.is_terminal for r in reqs))
        assert all(r.status == RequestStatus.COMPLETED for r in reqs)


def test_workers_publish_the_step_cost_their_engines_learned(runtime_factory: Any) -> None:
    """A generative model's published state carries its engine's step-time model and the
    steps it was fitted on: once enough steps ran, a fit of them (the synthetic model's
    4 ms a step and 0.2 ms a decode, plus the worker's own time)."""
    rt = runtime_factory([generative("chat", step_fixed_s=0.004)])

    async def go() -> None:
        handles = [await rt.generate("chat", "hi", max_tokens=48) for _ in range(4)]
        for h in handles:
            assert (await h.result()).status == RequestStatus.COMPLETED

    asyncio.run(go())
    (chat,) = [m for m in rt.snapshot().workers[0].models if m.model_id == "chat"]
    assert chat.step_samples >= 32
    assert chat.step_cost is not None
    assert chat.step_cost.predict_s(4) >= 0.004
    assert chat.step_cost.predict_s(4) < 0.1


def test_workers_publish_the_tpot_margin_their_engines_learned(runtime_factory: Any) -> None:
    """A generative model's published state (``/status.json``) carries the margin its
    engine learned: the prior while cold, then, once two spans of steps with decodes ran,
    the worst span's measured cycle against the prediction, within the clamp."""
    rt = runtime_factory([generative("chat", step_fixed_s=0.004)])

    async def go(max_tokens: int) -> None:
        handles = [await rt.generate("chat", "hi", max_tokens=max_tokens) for _ in range(4)]
        for h in handles:
            assert (await h.result()).status == RequestStatus.COMPLETED

    def published() -> MarginState:
        (chat,) = [m for m in rt.snapshot().workers[0].models if m.model_id == "chat"]
        json.dumps(asdict(chat))  # as /status.json renders it
        assert chat.tpot_margin is not None
        return chat.tpot_margin

    asyncio.run(go(24))
    cold = published()
    assert 0 < cold.steps < 128
    assert (cold.margin, cold.cycle_ratio) == (DEFAULT_MARGIN, None)
    for _ in range(4):  # ~47 steps with decodes each
        asyncio.run(go(48))
    warm = published()
    assert warm.steps >= 128 and warm.cycle_ratio is not None
    assert MARGIN_FLOOR <= warm.margin <= MARGIN_CAP
    assert warm.margin == pytest.approx(min(MARGIN_CAP, max(MARGIN_FLOOR, 1 / warm.cycle_ratio)))


def test_workers_publish_every_step_by_its_decodes(runtime_factory: Any) -> None:
    """The published tally counts every step: every token but a request's first is one
    decode of one step, and the prompts fed are the prompts' tokens; a step of four
    decodes takes at least the synthetic model's 4 ms + 4 x 0.2 ms."""
    rt = runtime_factory([generative("chat", step_fixed_s=0.004)])

    async def go() -> list[Request]:
        handles = [await rt.generate("chat", "hi there", max_tokens=48) for _ in range(4)]
        for h in handles:
            assert (await h.result()).status == RequestStatus.COMPLETED
        return [h.request for h in handles]

    reqs = asyncio.run(go())

    def published() -> Any:  # the worker publishes after the loop that ran the last step
        (chat,) = [m for m in rt.snapshot().workers[0].models if m.model_id == "chat"]
        return chat

    def decodes() -> int:
        return sum(int(k.split("+")[0]) * b.steps for k, b in published().step_times.items())

    wait_for(lambda: decodes() >= 4 * (48 - 1))
    assert decodes() == 4 * (48 - 1)
    chat = published()
    table = chat.step_times
    assert sum(b.prefill_tokens for b in table.values()) == sum(
        len(r.prompt_tokens) for r in reqs)
    assert all(b.prefill_tokens == 0 for k, b in table.items() if "+" not in k)
    # each decode attends to the positions before the token it feeds: the first
    # generated token's at the prompt's length, the last's 46 further
    assert sum(b.context_tokens for b in table.values()) == sum(
        sum(len(r.prompt_tokens) + i for i in range(48 - 1)) for r in reqs)
    assert table["4"].steps > 0 and table["4"].mean_s >= 0.004 + 4 * 0.0002
    assert asdict(chat)["step_times"]["4"]["steps"] == table["4"].steps  # /status.json
