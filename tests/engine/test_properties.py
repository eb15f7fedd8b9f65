"""Property tests: random interleavings of submits, try-submits, cancels, deadlines and
injected backend faults against the threaded runtime. Whatever happens, every request
ends in exactly one terminal state, nothing is lost or duplicated, queues stay bounded,
resident bytes stay within budgets, and every one-shot batch is a contiguous same-model
run of its worker's inbox."""

from __future__ import annotations

import time
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.engine.request import Final, Request, RequestStatus, SamplingParams
from sluice.engine.runtime import Runtime
from tests.engine.conftest import generative, make_runtime, oneshot

MODELS = ("a", "b", "chat")
QUEUE, INBOX, BUDGET_MB = 4, 2, 800

submit_op = st.tuples(
    st.sampled_from(["submit", "try_submit"]),
    st.sampled_from(MODELS),
    st.integers(1, 12),  # max_tokens
    st.one_of(st.none(), st.integers(1, 60)),  # deadline in ms
)
cancel_op = st.tuples(st.just("cancel"), st.integers(0, 40))
sleep_op = st.tuples(st.just("sleep"), st.integers(0, 8))
ops_strategy = st.lists(st.one_of(submit_op, submit_op, cancel_op, sleep_op), min_size=1,
                        max_size=40)
faults = st.lists(st.integers(1, 12), max_size=3, unique=True)


def build(fail_a: list[int], fail_chat: list[int]) -> Runtime:
    models = [
        oneshot("a", 300, fail_on_calls=fail_a, batch_fixed_s=0.001, per_item_s=0.0002),
        oneshot("b", 300, batch_fixed_s=0.001, per_item_s=0.0002),
        generative("chat", 500, fail_on_calls=fail_chat, step_fixed_s=0.0005,
                   decode_per_seq_s=0.0001, n_seq_max=2, n_ctx_per_seq=64),
    ]
    rt = make_runtime(models, workers=2, budget_mb=BUDGET_MB, inbox=INBOX, queue=QUEUE,
                      max_batch=3, max_wait_s=0.001)
    for w in rt.workers:
        w.trace = []
    rt.start()
    return rt


def replay_trace(trace: list[tuple[str, tuple[int, ...]]], model_of: dict[int, str]) -> None:
    """Rebuild the inbox from the trace; batches must be its head, all one model."""
    inbox: list[int] = []
    seen: set[int] = set()
    for what, ids in trace:
        if what == "offer":
            assert ids[0] not in seen, "a request was offered twice"
            seen.add(ids[0])
            inbox.append(ids[0])
        elif what == "leave":
            inbox.remove(ids[0])
        elif what == "engine":
            assert inbox[0] == ids[0], "generative request moved out of order"
            inbox.pop(0)
        else:  # batch
            assert list(ids) == inbox[: len(ids)], "batch is not the contiguous inbox head"
            assert len({model_of[i] for i in ids}) == 1, "batch mixes models"
            del inbox[: len(ids)]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops_strategy, fail_a=faults, fail_chat=faults)
def test_random_interleavings_keep_every_invariant(
    ops: list[tuple[Any, ...]], fail_a: list[int], fail_chat: list[int]
) -> None:
    rt = build(fail_a, fail_chat)
    requests: list[Request] = []
    finals: dict[int, list[Final]] = {}
    try:
        for op in ops:
            if op[0] in ("submit", "try_submit"):
                _, model, max_tokens, deadline_ms = op
                deadline = None if deadline_ms is None else rt.clock() + deadline_ms / 1000
                if model == "chat":
                    req = rt.new_request(model, prompt_tokens=(3, 4, 5),
                                         params=SamplingParams(max_tokens=max_tokens),
                                         deadline_s=deadline)
                else:
                    req = rt.new_request(model, input=f"x{len(requests)}", deadline_s=deadline)
                finals[req.request_id] = []
                req.listeners.append(
                    lambda e, rid=req.request_id: finals[rid].append(e)
                    if isinstance(e, Final) else None
                )
                requests.append(req)
                if op[0] == "submit":
                    rt.submit(req, timeout_s=0.2)
                else:
                    rt.try_submit(req)
            elif op[0] == "cancel" and requests:
                rt.cancel(requests[op[1] % len(requests)].request_id)
            elif op[0] == "sleep":
                time.sleep(op[1] / 1000)
            snap = rt.snapshot()
            assert snap.queue_depth <= QUEUE
            for state, depth in zip(snap.workers, snap.inbox_depths, strict=True):
                assert depth <= INBOX
                assert state.resident_bytes <= state.budget_bytes
    finally:
        rt.stop(drain_timeout_s=2.0)

    for req in requests:
        assert req.is_terminal, f"request {req.request_id} has no terminal state"
        assert len(finals[req.request_id]) == 1, "not exactly one Final"
        assert finals[req.request_id][0].status == req.status
        if req.status == RequestStatus.REJECTED:
            assert req.times.started_s is None and req.worker_id is None
        if req.status == RequestStatus.COMPLETED and req.kind == "generative":
            assert req.final is not None and req.final.completion_tokens <= req.params.max_tokens
    model_of = {r.request_id: r.model_id for r in requests}
    for w in rt.workers:
        assert w.trace is not None
        replay_trace(w.trace, model_of)
        assert w.state.resident_bytes == 0  # shutdown closed every model
