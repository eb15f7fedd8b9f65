"""Slot moves and retention: admitted requests take their slots (``SlotTable.apply``) and
their prefix is trimmed in place or copied; running sequences move down into the holes
ended ones left (``SlotTable.moves``); and the slot views and admin operations
(``/slots``: show, erase, save and restore) read and change the table."""

from __future__ import annotations

from functools import partial
from itertools import islice

from sluice.backends.base import BackendError
from sluice.engine.continuous.state import (
    SlotHolding,
    SlotState,
    _Group,
    _Sequence,
    _waiting_view,
)
from sluice.engine.continuous.token_path import TokenPath
from sluice.policy.step.prompt_cache import choose_restores
from sluice.policy.step.slot_layout import MAX_SLOT_MOVES_PER_STEP
from sluice.policy.step.step_data import Admission, PrefixCopy


class SlotMoves(TokenPath):
    """Starting admitted requests in their slots, and moving and showing slots."""

    def slot_states(self) -> tuple[SlotState, ...]:
        """Every slot, in order (see ``SlotState``)."""
        out = []
        for slot, entry in enumerate(self.slots.layout()):
            seq = self.running.get(slot)
            if seq is not None:
                out.append(SlotState(slot, seq.req.request_id, seq.n_prompt, seq.generated,
                                     seq.req.params.max_tokens))
            elif entry.kind == "held" and entry.request_id in self._groups:
                req = self._groups[entry.request_id].req
                out.append(SlotState(slot, req.request_id, len(req.prompt_tokens), 0,
                                     req.params.max_tokens))
            else:
                out.append(SlotState(slot, n_prompt_tokens=len(entry.tokens)))
        return tuple(out)

    def erase_slot(self, slot: int) -> int | None:
        """Forget an idle slot's retained prefix; the tokens it held (0 for an empty slot),
        or ``None`` when a request is using the slot (nothing changes)."""
        if self.slots.kind(slot) in ("running", "held"):
            return None
        tokens = self.slots.forget(slot)
        if tokens is None:
            return 0
        self.model.release_sequence(slot)
        return len(tokens)

    def slot_holding(self, slot: int) -> SlotHolding:
        """What ``slot`` holds now: a running sequence (its fed tokens), a fork slot held
        for a started request, a retained prefix, or nothing."""
        entry = self.slots.entry(slot)
        seq = self.running.get(slot)
        if seq is not None:
            return SlotHolding("running", tuple(seq.tokens[: seq.n_fed]), seq.req.tenant_id)
        if entry.kind == "retained":
            return SlotHolding("retained", tuple(entry.tokens), entry.tenant)
        return SlotHolding("held" if entry.kind == "held" else "free", (), "")

    def adopt_slot(self, slot: int, tokens: list[int], tenant: str) -> None:
        """The model's KV in the free ``slot`` now holds ``tokens`` (a restored sequence):
        keep it as the most recently used retained prefix of ``tenant``."""
        self._change_slots(partial(self.slots.adopt, slot, tokens, tenant))

    def _restore_prefixes(self) -> float:
        """Put back, each into the lowest free slot as a retained prefix trimmed to what it
        shares, the prompt-cache entries that give the head of the line more of its prompt
        than the slots do (``choose_restores``); the step planner then starts each request
        in its restored slot. A restore that fails forgets the entry. Returns the seconds
        the restores took."""
        cache = self.prompt_cache
        free = self.slots.free_slots
        if cache is None or not self.waiting or not len(cache) or not free:
            return 0.0
        t0 = self._clock()
        head = list(islice(self.waiting, len(free)))
        donors = [(r.tokens, len(r.tokens), r.tenant) for r in self.slots.retained()]
        donors += [(seq.tokens, seq.n_fed, seq.req.tenant_id)
                   for seq in self.running.values()]
        waiting = [_waiting_view(req) for req in head]
        for restore in choose_restores(cache, self.config, waiting, donors, len(free)):
            free = self.slots.free_slots
            if not free:
                break
            slot, entry = free[0], cache.take(restore.key, restore.n_tokens)
            try:
                self.model.set_sequence_state(slot, entry.payload, len(entry.tokens))
                self.model.trim_sequence(slot, restore.n_tokens)
            except BackendError:
                self.model.release_sequence(slot)
                cache.discard(restore.key)
                continue
            self.adopt_slot(slot, list(entry.tokens[: restore.n_tokens]), entry.tenant)
        return self._clock() - t0

    def _compact(self) -> None:
        """Move running sequences down into the holes ended ones left (and retained prefixes
        out of their way), so that a decode step spans as few KV streams as it feeds
        (``sluice.policy.step.slot_layout``). Only with one stream per slot: a unified cache
        has no streams to span. A failed copy ends the moved sequence's request (or
        forgets the retained prefix)."""
        for action in self.slots.moves(MAX_SLOT_MOVES_PER_STEP):
            if action.src in self.running:
                seq = self.running[action.src]
                if not self._barrier(seq.group, partial(self._move_sequence, seq, action.dst)):
                    return  # its request failed and freed its slots: the rest is stale
            else:
                self._move_retained(action.src, action.dst)
            self.slot_moves += 1

    def _move_sequence(self, seq: _Sequence, dst: int) -> bool:
        src = seq.slot
        self.model.copy_sequence(src, dst, seq.n_fed)
        self.slots.move(src, dst)
        self.model.release_sequence(src)
        del self.running[src]
        seq.slot = dst
        self.running[dst] = seq
        return True

    def _move_retained(self, src: int, dst: int) -> None:
        tokens = self.slots.entry(src).tokens
        try:
            self.model.copy_sequence(src, dst, len(tokens))
        except BackendError:
            self.slots.forget(src)
            self._clear((src, dst))
            return
        self.slots.move(src, dst)  # same place in the least-recently-used order
        self.model.release_sequence(src)

    def _start(self, admissions: tuple[Admission, ...], now: float) -> set[int]:
        """Start admitted requests in plan order: take the slots, reserve their KV blocks,
        forget the slot's old KV, copy a shared prefix, build choice 0's chooser. Returns
        the slots left unstarted.

        A request cancelled or ended by another thread since the plan was made stays in the
        line, where the next step's sweep ends it properly; the admissions after it wait
        for the next plan too, since this plan counted on its slot and prefix."""
        for i, adm in enumerate(admissions):
            index = self._waiting_index(adm.request_id)
            req = self.waiting[index]
            donor = adm.prefix.donor_slot if adm.prefix and not adm.in_place else None
            # a donor kept in place earlier in this plan may have failed while starting; a
            # retained donor is copied from where it idles
            if ((donor is not None and donor not in self.running
                 and self.slots.kind(donor) != "retained") or not req.mark_running(now)):
                return {s for a in admissions[i:] for s in a.slots}
            del self.waiting[index]
            self._change_slots(partial(self._apply_admission, adm))
            seed = req.params.seed if req.params.seed is not None else req.request_id
            group = _Group(req, n=len(adm.slots), seed=seed, fork_slots=list(adm.fork_slots))
            if req.params.prompt_logprobs:
                group.prompt_logprobs = [None]
            self._groups[req.request_id] = group
            seq = self._barrier(group, partial(self._first_sequence, group, adm))
            if seq is None:  # its parameters or grammar failed it (fork slots are freed)
                self._free_slot(adm.slot)
                continue
            self.running[adm.slot] = seq
            group.live.append(seq)
            if adm.prefix is not None:
                self._barrier(group, partial(self._reuse_prefix, seq, adm.prefix))
            self._report_progress(seq, now)
        return set()

    def _apply_admission(self, adm: Admission) -> tuple[int, ...]:
        """Take an admission's slots in the table; the slots whose KV is to be cleared."""
        return self.slots.apply(adm).clear

    def _reuse_prefix(self, seq: _Sequence, prefix: PrefixCopy) -> None:
        """Start ``seq`` after a prefix: kept in its own retained slot (trimmed past the
        prefix), or copied from a donor (running, or a retained slot that stays retained)."""
        if prefix.donor_slot == seq.slot:
            self.model.trim_sequence(seq.slot, prefix.n_tokens)
            self.retained_prefix_tokens += prefix.n_tokens
        else:
            self.model.copy_sequence(prefix.donor_slot, seq.slot, prefix.n_tokens)
        seq.n_fed = prefix.n_tokens
        self.reused_prefix_tokens += prefix.n_tokens
        req = seq.group.req
        req.cached_prompt_tokens = max(req.cached_prompt_tokens, prefix.n_tokens)

    def _waiting_index(self, request_id: int) -> int:
        # Admissions come from the head of the line, so this is almost always index 0.
        for index, req in enumerate(self.waiting):
            if req.request_id == request_id:
                return index
        raise RuntimeError(f"plan admits request {request_id}, which is not waiting")
