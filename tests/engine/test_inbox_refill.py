"""A worker whose engine takes a request out of its waiting line tells the dispatcher, so
the inbox is refilled at once and no sequence slot idles while requests are queued."""

from __future__ import annotations

import threading
import time
from typing import Any

from sluice.engine.request import Event, Final, SamplingParams
from tests.engine.conftest import generative


def test_slots_stay_busy_when_every_inbox_is_full(runtime_factory: Any) -> None:
    """24 requests, 4 slots, an inbox of 2: six waves of 9 steps of 20 ms is 1.08 s.
    Before the fix the dispatcher slept until the next completion or its 0.5 s poll
    whenever the inbox drained into the engine, and the run took about 2.0 s."""
    rt = runtime_factory([generative("chat", n_seq_max=4, step_fixed_s=0.02,
                                     decode_per_seq_s=0.0, prefill_per_token_s=0.0)],
                         inbox=2, queue=100)
    done = threading.Event()
    finished: list[Final] = []
    lock = threading.Lock()

    def on_event(event: Event) -> None:
        if isinstance(event, Final):
            with lock:
                finished.append(event)
                if len(finished) == 24:
                    done.set()

    t0 = time.monotonic()
    for _ in range(24):
        req = rt.new_request("chat", prompt_tokens=(1, 5, 6),
                             params=SamplingParams(max_tokens=8, temperature=0.0))
        req.listeners.append(on_event)
        assert rt.try_submit(req) is None
    assert done.wait(30)
    wall_s = time.monotonic() - t0
    assert all(f.completion_tokens == 8 for f in finished)
    assert wall_s < 1.6, f"{wall_s:.2f} s: slots idled while requests were queued"
