"""Dynamic batching and execution for one worker's one-shot models (encoders,
classifiers): the counterpart of ``ContinuousEngine`` for models that answer a whole
batch in one call.

The worker owns the inbox and the resident set; this object decides how many requests
at the inbox head run now as one batch (``plan``, through the pure ``decide_batch``
policy) and runs a batch (``run``): every member ends in exactly one terminal state —
completed, failed with the backend's error (the whole batch) or its ``InputError``
(that input alone), or expired when the batch ends past its deadline (never completed
late). Owned by the worker thread; not thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sluice.backends.base import InputError, OneShotModel
from sluice.engine.messages import Batch, BatchDone, Send
from sluice.engine.request import Request, RequestStatus, end_stopped
from sluice.policy.variants.batcher import decide_batch


class OneShotExecutor:
    """Batches and runs the one-shot requests at the head of one worker's inbox."""

    def __init__(
        self,
        *,
        max_batch_size: int,
        max_wait_s: float,
        clock: Callable[[], float],
        send: Send,
        on_start: Callable[[str, float], None],
        on_end: Callable[[str], None],
    ) -> None:
        """``send`` reports each batch (``Batch`` as it starts, ``BatchDone`` as it
        completes); ``on_start(model_id, now)`` runs just before the backend call (the worker
        pins the model, publishes its state, which counts ``active_count``, and sends what
        it holds);
        ``on_end(model_id)`` runs after it, whatever happened (the worker unpins)."""
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self._clock = clock
        self._send = send
        self._on_start = on_start
        self._on_end = on_end
        self.active_count = 0
        """Members of the batch running now (0 between batches)."""
        self._wakeup_s: float | None = None

    def plan(self, inbox_model_ids: Sequence[str], head_enqueued_s: float, now: float) -> int:
        """How many requests at the inbox head (a one-shot one) to run now as one batch;
        0 means wait for company until ``next_wakeup_s``."""
        decision = decide_batch(
            inbox_model_ids,
            head_enqueued_s,
            now,
            max_batch_size=self.max_batch_size,
            max_wait_s=self.max_wait_s,
        )
        self._wakeup_s = decision.wait_until_s if decision.take == 0 else None
        return decision.take

    def clear_wakeup(self) -> None:
        """Forget the last plan's wait (the worker looks at its inbox afresh)."""
        self._wakeup_s = None

    def next_wakeup_s(self) -> float | None:
        """When the head's wait for company ends, if the last plan was to wait."""
        return self._wakeup_s

    def run(self, model: OneShotModel, batch: Sequence[Request]) -> None:
        """Run ``batch`` (same-model requests taken off the inbox) in one backend call.
        Members cancelled or expired meanwhile end without running."""
        now = self._clock()
        live = [r for r in batch if r.mark_running(now)]
        for r in batch:
            if r not in live:
                end_stopped(r, now, "before its batch ran")
        if not live:
            return
        model_id = model.spec.model_id
        for r in live:
            r.batch_size = len(live)
        self.active_count = len(live)
        self._send(Batch(model_id, len(live)))
        self._on_start(model_id, now)
        try:
            self._call(model, live, now)
        finally:
            self.active_count = 0
            self._on_end(model_id)

    def _call(self, model: OneShotModel, live: list[Request], started_s: float) -> None:
        model_id = model.spec.model_id
        try:
            outputs = model.run_batch([r.input for r in live])
            if len(outputs) != len(live):
                raise RuntimeError(f"{len(outputs)} outputs for {len(live)} inputs")
        except Exception as exc:
            done = self._clock()
            for r in live:
                r.finish(
                    RequestStatus.FAILED, done, error=f"backend error: {exc}",
                    error_code="backend_error",
                )
            return
        done = self._clock()
        self._send(BatchDone(model_id, len(live), done - started_s))
        for r, out in zip(live, outputs, strict=True):
            if isinstance(out, InputError):  # this input fails alone
                r.finish(RequestStatus.FAILED, done, error=out.message, error_code=out.code)
            elif r.deadline_s is not None and done >= r.deadline_s:  # never complete late
                r.finish(RequestStatus.EXPIRED, done, error="deadline passed while running",
                         error_code="deadline")
            else:
                r.finish(RequestStatus.COMPLETED, done, result=out)
