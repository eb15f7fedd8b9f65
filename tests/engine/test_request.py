"""The request state machine: first terminal transition wins, exactly one Final."""

from __future__ import annotations

import threading

from sluice.engine.request import Final, Request, RequestStatus, TokenEvent


def make(**kw: object) -> Request:
    return Request(request_id=1, model_id="m", kind="generative", arrival_s=0.0, **kw)  # type: ignore[arg-type]


def test_states_move_forward_and_first_terminal_wins() -> None:
    req = make()
    events: list[object] = []
    req.listeners.append(events.append)
    assert req.mark_queued(1.0)
    assert not req.mark_queued(1.5)
    assert req.mark_running(2.0)
    req.emit_token(TokenEvent(index=0, token_id=5, text="a", time_s=2.5))
    assert req.finish(RequestStatus.COMPLETED, 3.0, finish_reason="length")
    assert not req.finish(RequestStatus.FAILED, 4.0, error="late")
    assert req.status == RequestStatus.COMPLETED
    assert req.times.first_token_s == 2.5 and req.times.finished_s == 3.0
    finals = [e for e in events if isinstance(e, Final)]
    assert len(finals) == 1 and finals[0].finish_reason == "length"
    assert finals[0].completion_tokens == 1


def test_tokens_after_the_end_are_dropped() -> None:
    req = make()
    events: list[object] = []
    req.listeners.append(events.append)
    req.mark_queued(0.0)
    req.mark_running(0.0)
    req.finish(RequestStatus.CANCELLED, 1.0)
    req.emit_token(TokenEvent(index=0, token_id=1, text="x", time_s=2.0))
    assert len(events) == 1 and isinstance(events[0], Final)


def test_cancel_requested_blocks_running() -> None:
    req = make()
    req.mark_queued(0.0)
    req.cancel_requested = True
    assert not req.mark_running(1.0)


def _race_once(statuses: list[RequestStatus]) -> tuple[list[bool], list[Final], Request]:
    req = make()
    finals: list[Final] = []
    wins: list[bool] = []
    lock = threading.Lock()

    def on_event(e: object) -> None:
        if isinstance(e, Final):
            with lock:
                finals.append(e)

    def finish(status: RequestStatus) -> None:
        won = req.finish(status, 1.0)
        with lock:
            wins.append(won)

    req.listeners.append(on_event)
    req.mark_queued(0.0)
    threads = [threading.Thread(target=finish, args=(s,)) for s in statuses]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return wins, finals, req


def test_racing_terminal_transitions_deliver_one_final() -> None:
    statuses = [RequestStatus.COMPLETED, RequestStatus.CANCELLED, RequestStatus.EXPIRED,
                RequestStatus.FAILED]
    for _ in range(50):
        wins, finals, req = _race_once(statuses)
        assert sum(wins) == 1
        assert len(finals) == 1 and finals[0].status == req.status
