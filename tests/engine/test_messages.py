"""Workers and the control plane talk in messages: the worker runs its own copy of a
request and reports in outbound messages that only the runtime's pump applies; no worker
thread takes the runtime's lock."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from sluice.engine.messages import Cancel, Done, Started, Token
from sluice.engine.request import Event, Final, Request, RequestStatus, SamplingParams
from sluice.engine.runtime import Runtime
from sluice.engine.work_item import WorkItem
from sluice.policy.capacity.keep_alive import KeepAlive
from tests.engine.conftest import generative, make_runtime, oneshot


class RecordingLock:
    """An RLock that notes the name of every thread that takes it."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.takers: set[str] = set()

    def _note(self) -> None:
        self.takers.add(threading.current_thread().name)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self._lock.acquire(blocking, timeout)
        if got:
            self._note()
        return got

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *_: object) -> None:
        self.release()

    # What threading.Condition uses of an RLock:
    def _is_owned(self) -> bool:
        return self._lock._is_owned()  # type: ignore[attr-defined, no-any-return]

    def _release_save(self) -> Any:
        return self._lock._release_save()  # type: ignore[attr-defined]

    def _acquire_restore(self, state: Any) -> None:
        self._lock._acquire_restore(state)  # type: ignore[attr-defined]
        self._note()


def wait_for(cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.002)


def status(req: Request) -> RequestStatus:
    return req.status


def chat_request(rt: Runtime, max_tokens: int = 4, **kw: Any) -> Request:
    return rt.new_request("chat", prompt_tokens=(3, 4, 5),
                          params=SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                                ignore_eos=True), **kw)


def test_no_worker_thread_takes_the_runtime_lock_and_listeners_run_on_the_pump() -> None:
    rt = make_runtime([generative("chat", step_fixed_s=0.002), oneshot("enc")])
    lock = RecordingLock()
    rt._cv = threading.Condition(lock)  # type: ignore[arg-type]
    listener_threads: set[str] = set()
    rt.start()
    try:
        reqs = [chat_request(rt) for _ in range(3)]
        reqs.append(rt.new_request("enc", input="x", keep_alive=KeepAlive(idle_s=0.0)))
        long = chat_request(rt, max_tokens=100)
        for req in [*reqs, long]:
            req.listeners.append(lambda e: listener_threads.add(threading.current_thread().name))
            assert rt.submit(req, timeout_s=5) is None
        wait_for(lambda: all(r.is_terminal for r in reqs))
        wait_for(lambda: long.times.first_token_s is not None)
        assert rt.cancel(long.request_id)
        wait_for(lambda: long.is_terminal)
        # The encoder's keep-alive of 0 ran out: the worker asked, the pump answered.
        wait_for(lambda: "enc" not in rt.workers[0].state.resident)
    finally:
        rt.stop(drain_timeout_s=1.0)
    assert all(r.status == RequestStatus.COMPLETED for r in reqs)
    assert long.status == RequestStatus.CANCELLED
    assert long.final is not None and long.final.error == "cancelled by client"
    assert listener_threads == {"sluice-pump"}
    assert "sluice-pump" in lock.takers and "sluice-dispatch" in lock.takers
    assert not {t for t in lock.takers if t.startswith("sluice-worker")}


def test_the_worker_runs_its_own_copy_and_the_pump_applies_what_it_sent() -> None:
    rt = make_runtime([generative("chat")])  # threads not started: driven by hand
    req = chat_request(rt, max_tokens=3)
    events: list[Event] = []
    req.listeners.append(events.append)
    assert rt.try_submit(req) is None
    with rt._cv:
        assert rt._dispatch(rt.clock())
    worker = rt.workers[0]
    (run,) = worker._inbox
    item = run.item
    assert isinstance(item, WorkItem) and item is not req
    assert item.request_id == req.request_id and item.prompt_tokens == req.prompt_tokens

    for _ in range(20):  # the worker's loop, until its copy has ended
        worker._loop_once()
        worker._flush()
        if item.is_terminal:
            break
    assert item.status == RequestStatus.COMPLETED
    assert status(req) == RequestStatus.QUEUED and events == []  # nothing applied yet
    sent = []
    while not rt._outbox.empty():
        _, messages = rt._outbox.get()
        sent.extend(messages)
        rt._apply_all(worker, messages)
    mine = [m for m in sent if isinstance(m, (Started, Token, Done))]
    assert isinstance(mine[0], Started) and isinstance(mine[-1], Done)
    assert sum(isinstance(m, Token) for m in mine) == 3
    assert req.status == RequestStatus.COMPLETED
    assert [e.index for e in events if not isinstance(e, Final)] == [0, 1, 2]
    assert isinstance(events[-1], Final) and events[-1] == item.final
    assert req.times.started_s == item.times.started_s
    assert req.times.finished_s == item.times.finished_s
    assert req.request_id not in worker.routed and rt._live == {}


def test_a_cancel_reaches_an_inbox_request_as_a_message() -> None:
    rt = make_runtime([generative("chat")])
    req = chat_request(rt)
    assert rt.try_submit(req) is None
    with rt._cv:
        assert rt._dispatch(rt.clock())
    worker = rt.workers[0]
    assert rt.cancel(req.request_id)
    assert list(worker._controls) == [Cancel(req.request_id)]
    assert status(req) == RequestStatus.QUEUED and not req.cancel_requested
    worker._handle_controls()
    worker._loop_once()
    worker._flush()
    assert worker.inbox_depth() == 0
    rt.drain_outbox()
    assert req.status == RequestStatus.CANCELLED
    assert req.final is not None and req.final.error == "cancelled while queued at the worker"
    assert rt._live == {}
