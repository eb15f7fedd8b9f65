"""How requests leave the engine: a choice finishes (its KV retained or freed), a request
ends with one ``Final`` once its last choice does, cancelled, expired and failed requests
are swept out before each pass, and the crash barrier (``_barrier``) confines a fault in
one request's own work to that request."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

from sluice.backends.base import BackendError
from sluice.engine.constraints import ConstraintError, GrammarFailure
from sluice.engine.continuous.state import (
    EngineState,
    _Batch,
    _Group,
    _reason_of,
    _Sequence,
)
from sluice.engine.request import (
    ChoiceFinal,
    Request,
    RequestStatus,
    TokenEvent,
    expired_what,
)
from sluice.engine.sampling import SamplingError
from sluice.policy.step.prompt_cache import CachedPrompt, to_keep


class Retirement(EngineState):
    """Ending choices and requests, and the crash barrier."""

    def _barrier(self, group: _Group, work: Callable[[], Any]) -> Any:
        """Run one request's own work; an exception there ends that request alone (FAILED,
        with a message saying what broke) and returns None."""
        try:
            return work()
        except Exception as exc:  # attributable to this request: it alone fails
            message, code = _fault_message(exc)
            self._end(group, RequestStatus.FAILED, self._clock(), error=message,
                      error_code=code)
            return None

    def _clear(self, slots: tuple[int, ...]) -> None:
        """Clear the model's KV in ``slots`` (the slot table freed or re-assigned them)."""
        for slot in slots:
            self.model.release_sequence(slot)

    def _change_slots(self, change: Callable[[], tuple[int, ...]]) -> None:
        """Make a slot-table change and clear the slots it returns; a retained prefix it
        drops (past ``max_retained_slots``, evicted, or handed out) is first saved to the
        prompt cache in host memory, while its KV is still there."""
        cache = self.prompt_cache
        if cache is None:
            self._clear(change())
            return
        before = {r.slot: r for r in self.slots.retained()}
        slots = change()
        for kept in to_keep(cache, before, slots):
            try:
                state = self.model.sequence_state(kept.slot)
            except BackendError:
                continue  # not kept: a later prompt computes it again
            cache.put(CachedPrompt(tuple(kept.tokens), kept.tenant, len(state), state))
        self._clear(slots)

    def _free_slot(self, slot: int) -> None:
        self._clear(self.slots.retire(slot))

    def _drop_sequence(self, seq: _Sequence, now: float, retain: bool = False) -> None:
        """Free a choice's slot and KV (``retain``: keep the KV as a retained prefix when
        the engine retains prefixes; past ``max_retained_slots`` the least recently used
        retained slot is cleared), and flush its held-back text."""
        if self.running.get(seq.slot) is seq:
            del self.running[seq.slot]
            kept = seq.tokens[: seq.n_fed] if retain else None
            self._change_slots(partial(self.slots.retire, seq.slot, kept, n_fed=seq.n_fed,
                                       tenant=seq.req.tenant_id))
        if seq in seq.group.live:
            seq.group.live.remove(seq)
        tail = seq.text.flush()
        if tail:
            seq.req.emit_token(TokenEvent(index=seq.generated - 1, token_id=-1, text=tail,
                                          time_s=now, choice=seq.choice))

    def _finish_choice(self, seq: _Sequence, reason: str, now: float) -> None:
        """A choice ended normally (its KV may be retained); the request completes with
        its last choice."""
        self._drop_sequence(seq, now, retain=True)
        group = seq.group
        group.finished[seq.choice] = ChoiceFinal(seq.choice, seq.text.text, reason,
                                                 seq.generated, seq.text.matched)
        if not group.live and not group.fork_slots:
            self._end(group, RequestStatus.COMPLETED, now)

    def _end(self, group: _Group, status: RequestStatus, now: float, **final: Any) -> None:
        """End a request and every choice it still runs: free their slots, KV and held
        fork slots, then deliver its one ``Final``."""
        for seq in list(group.live):
            self._drop_sequence(seq, now)
            group.finished.setdefault(seq.choice, ChoiceFinal(
                seq.choice, seq.text.text, final.get("finish_reason", "") or
                _reason_of(status), seq.generated))
        for slot in group.fork_slots:
            self._free_slot(slot)
        group.fork_slots.clear()
        self._groups.pop(group.req.request_id, None)
        req = group.req
        if not req.is_terminal:
            choices = tuple(group.finished.get(i) or ChoiceFinal(i, "", _reason_of(status), 0)
                            for i in range(group.n))
            first = choices[0]
            final.setdefault("finish_reason", first.finish_reason)
            final.setdefault("text", first.text)
            final.setdefault("stop_sequence", first.stop_sequence)
            final.setdefault("completion_tokens", sum(c.completion_tokens for c in choices))
            if group.n > 1:
                final.setdefault("choices", choices)
            if group.prompt_logprobs is not None:
                final.setdefault("prompt_logprobs", tuple(group.prompt_logprobs))
            req.finish(status, now, **final)
        self._on_retire(req)

    def _retire_stopped(self, now: float) -> None:
        """Cancelled, expired or already-ended requests leave before the next pass."""
        for group in list(self._groups.values()):
            req = group.req
            if req.is_terminal:
                self._end(group, req.status, now)
            elif req.cancel_requested:
                self._end(group, RequestStatus.CANCELLED, now, error="cancelled by client")
            elif req.missed_start(now):
                self._end(group, RequestStatus.EXPIRED, now,
                          error=f"{expired_what(req, now)} passed while running",
                          error_code="deadline")
        keep: deque[Request] = deque()
        for req in self.waiting:
            if req.cancel_requested:
                req.finish(RequestStatus.CANCELLED, now, error="cancelled by client")
            elif req.missed_start(now):
                req.finish(
                    RequestStatus.EXPIRED, now,
                    error=f"{expired_what(req, now)} passed while waiting for a slot",
                    error_code="deadline",
                )
            if req.is_terminal:
                self._on_retire(req)
            else:
                keep.append(req)
        self.waiting = keep

    def _fail(self, batch: _Batch, exc: Exception) -> None:
        now = self._clock()
        for group in {id(s.group): s.group for s in batch.owners}.values():
            self._end(group, RequestStatus.FAILED, now, error=f"backend error: {exc}",
                      error_code="backend_error")

    def abort_all(self, now: float, error: str) -> None:
        """Cancel everything (shutdown)."""
        for req in self.requests():
            req.finish(RequestStatus.CANCELLED, now, error=error, error_code="shutdown")
        self._retire_stopped(now)


def _fault_message(exc: Exception) -> tuple[str, str]:
    """What a client is told when its request's own work fails."""
    if isinstance(exc, SamplingError):
        return str(exc), "internal_error"
    if isinstance(exc, ConstraintError):
        return f"invalid response_format: {exc}", "invalid_request_error"
    if isinstance(exc, GrammarFailure):
        return f"constrained decoding failed: {exc}", "grammar_error"
    if isinstance(exc, ValueError):
        return str(exc), "invalid_request_error"
    return f"internal error in this request ({type(exc).__name__}: {exc})", "internal_error"
