"""The process worker's contract at the runtime level: what is refused (an unknown
isolation, a process-ending fault in thread mode, a fake clock, a ``Call``'s closure, an
admin method not on the list), and what crosses the pipe (a ``WorkItem``, ``AdminCall``)."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from sluice.backends.faults import FaultPlan
from sluice.backends.synthetic import SyntheticBackend
from sluice.engine.messages import AdminCall
from sluice.engine.request import Request, SamplingParams
from sluice.engine.runtime import Runtime
from sluice.engine.work_item import WorkItem
from tests.engine.conftest import generative, make_runtime


def _process_config() -> object:
    return dataclasses.replace(make_runtime([generative("chat")]).config, isolation="process")


def test_bad_isolation_and_a_process_kill_in_thread_mode_are_refused() -> None:
    config = make_runtime([generative("chat")]).config
    with pytest.raises(ValueError, match="isolation must be thread or process"):
        dataclasses.replace(config, isolation="fork")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="kill_mode 'segv' ends a process"):
        dataclasses.replace(config, faults={"chat": FaultPlan(kill_mode="segv")})
    with pytest.raises(ValueError, match="kill_mode must be"):
        FaultPlan(kill_mode="explode")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"time\.monotonic"):
        Runtime(_process_config(), {"synthetic": SyntheticBackend()},  # type: ignore[arg-type]
                clock=lambda: 0.0)


def test_a_work_item_pickles_as_the_fields_it_copies() -> None:
    req = Request(7, "chat", "generative", 1.5, prompt_tokens=(1, 2),
                  params=SamplingParams(max_tokens=3), tenant_id="t", priority=2,
                  deadline_s=9.0, worker_id=1)
    req.listeners.append(lambda _: None)  # the client's: never crosses
    req.times.queued_s = 2.0
    item = pickle.loads(pickle.dumps(WorkItem.of(req)))
    assert isinstance(item, WorkItem) and item.listeners == []
    assert (item.request_id, item.prompt_tokens, item.params, item.tenant_id, item.priority,
            item.deadline_s, item.worker_id, item.times.queued_s) == (
        7, (1, 2), req.params, "t", 2, 9.0, 1, 2.0)


def test_a_worker_process_answers_admin_calls_and_refuses_closures() -> None:
    rt = Runtime(_process_config(), {"synthetic": SyntheticBackend()})  # type: ignore[arg-type]
    rt.start()
    try:
        assert rt.call_on_workers("chat", "load") == [True]
        [worker] = rt.workers
        free, total = worker.ask("integrity").result(30)["chat"]
        assert free == total > 0
        with pytest.raises(TypeError, match="does not cross to a worker process"):
            worker.call(lambda: 1).result(5)
        with pytest.raises(ValueError, match="not resident"):
            worker.ask("erase_slot_now", "nope", 0).result(30)
        with pytest.raises(ValueError, match="is not one of"):
            AdminCall(1, "close_models")
        assert rt.health().alive
    finally:
        rt.stop()
