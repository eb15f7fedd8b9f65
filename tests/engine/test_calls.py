"""The worker's call registry: every call settled exactly once, whichever path ends it."""

from __future__ import annotations

import pytest

from sluice.engine.messages import Reply
from sluice.engine.worker.calls import Calls


def test_answer_resolves_the_call_it_names_and_a_second_answer_is_ignored() -> None:
    calls = Calls()
    first_id, first = calls.open()
    second_id, second = calls.open()
    assert first_id != second_id
    calls.answer(Reply(second_id, "two"))
    assert second.result(0) == "two" and not first.done()
    calls.answer(Reply(second_id, "again"))
    calls.fail(second_id, RuntimeError("late"))
    assert second.result(0) == "two"
    calls.answer(Reply(first_id, error=ValueError("no")))
    with pytest.raises(ValueError, match="no"):
        first.result(0)
    assert calls.pending_count() == 0


def test_fail_all_fails_the_pending_closes_and_later_answers_change_nothing() -> None:
    calls = Calls()
    call_id, fut = calls.open()
    calls.fail_all(RuntimeError("given up"))
    calls.answer(Reply(call_id, "late"))
    with pytest.raises(RuntimeError, match="given up"):
        fut.result(0)
    late_id, late = calls.open()  # opened after the worker was given up: never waits
    assert late_id != call_id
    with pytest.raises(RuntimeError, match="given up"):
        late.result(0)
    assert calls.pending_count() == 0


def test_fail_ends_one_unsent_call() -> None:
    calls = Calls()
    sent_id, sent = calls.open()
    unsent_id, unsent = calls.open()
    calls.fail(unsent_id, RuntimeError("worker is stopping"))
    assert unsent.exception(0) is not None and not sent.done()
    calls.answer(Reply(sent_id, True))
    assert sent.result(0) is True
