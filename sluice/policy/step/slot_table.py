"""Which sequence slot holds what, and the KV blocks reserved in each: the one slot
bookkeeping of the server's engine (``sluice.engine.continuous``) and the simulator's
(``sluice.sim.engine``).

The step planner decides (``plan_step`` returns ``Admission`` records); a ``SlotTable``
applies those decisions and the ones that follow from a sequence ending or moving:

- ``apply(admission)`` takes the admission's slots (a retained donor kept in place, free
  slots, retained slots handed out), clears the retained slots it evicts, reserves its KV
  blocks (``reserve_admission``), and returns the ``SlotOps`` the model's KV must carry out
  (which slots to clear; the prefix to keep or copy).
- ``retire(slot, prefix)`` ends a sequence: its blocks go back to the allocator and the slot
  becomes free, or, when ``retains`` says so, keeps ``prefix`` as the most recently used
  retained prefix (past ``max_retained_slots`` the least recently used one is dropped).
- ``moves`` / ``move`` keep the running sequences on the lowest slots
  (``sluice.policy.step.slot_layout``), with one KV stream per slot.
- ``free_slots`` and ``retained`` are what the planner's ``StepView`` is given.

Invariants (``check_integrity``): every slot ``0 .. n_slots - 1`` is exactly one of free,
retained (an idle slot keeping the KV of the sequence it last ran), running (a sequence's)
or held (kept for a request's later choice until its fork); exactly the running and held
slots own KV blocks; at most ``max_retained_slots`` are retained. Free slots are handed out
lowest first: llama.cpp (one KV stream per slot) decodes a batch spread over many streams up
to 3x slower than the same batch on the lowest slots, so sequences are kept packed.

Pure: no model, no clock; the caller applies ``SlotOps`` to its KV (the engine to the
model's, the simulator to nothing).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from sluice.policy.step.kv_blocks import KVBlockAllocator
from sluice.policy.step.prefix_retention import retain_prefix, retains
from sluice.policy.step.slot_layout import SlotMove, compaction_moves
from sluice.policy.step.step_data import Admission, EngineConfig, PrefixCopy, RetainedSeq

SlotKind = Literal["free", "retained", "running", "held"]

__all__ = ["SlotEntry", "SlotKind", "SlotOps", "SlotTable", "reserve_admission"]


@dataclass(frozen=True, slots=True)
class SlotOps:
    """What the KV of the slots must do once an admission is applied, in order."""

    clear: tuple[int, ...]
    """Slots whose KV is cleared: the retained slots evicted, then the admission's slots
    that do not keep their KV in place."""
    prefix: PrefixCopy | None
    """Then the prefix its first sequence starts after: trimmed in place when
    ``prefix.donor_slot`` is the admission's slot, else copied from the donor."""


@dataclass(frozen=True, slots=True)
class SlotEntry:
    """What one slot holds (``SlotTable.layout``)."""

    kind: SlotKind
    request_id: int | None = None
    """The request whose sequence runs there or for which it is held."""
    tokens: Sequence[int] = ()
    """A retained slot's tokens (its KV positions ``0 .. len - 1``)."""
    tenant: str = ""
    """Whose prompt a retained slot's tokens came from."""


class SlotTable:
    """Free, retained, running and held slots of one engine, with its KV allocator."""

    def __init__(self, config: EngineConfig, n_slots: int, kv: KVBlockAllocator,
                 unified: bool) -> None:
        if n_slots < 1:
            raise ValueError(f"n_slots must be >= 1, got {n_slots}")
        self.config = config
        self.n_slots = n_slots
        self.kv = kv
        self.unified = unified
        """One KV cache shared by every slot: retained KV fills pool blocks (lent to the
        planner), and there are no per-slot streams to keep packed."""
        self._free: set[int] = set(range(n_slots))
        self._retained: dict[int, Sequence[int]] = {}
        """Retained slot -> its tokens, least recently used first."""
        self._tenant: dict[int, str] = {}
        """Whose prompt each retained slot's tokens came from."""
        self._busy: dict[int, tuple[Literal["running", "held"], int]] = {}
        """Running and held slots -> (which, the request id)."""

    @classmethod
    def for_context(cls, config: EngineConfig, n_ctx_tokens: int, n_slots: int,
                    unified: bool) -> SlotTable:
        """A table over a fresh ``KVBlockAllocator`` sized from a llama.cpp context."""
        kv = KVBlockAllocator.for_context(n_ctx_tokens, n_slots, config.kv_block_tokens,
                                          unified=unified)
        return cls(config, n_slots, kv, unified)

    # -- what the planner sees ---------------------------------------------------------

    @property
    def free_slots(self) -> tuple[int, ...]:
        """Idle slots holding nothing, in the order to hand out (lowest first)."""
        return tuple(sorted(self._free))

    def retained(self) -> tuple[RetainedSeq, ...]:
        """Retained slots, least recently used first, as the planner sees them."""
        return tuple(RetainedSeq(slot, tokens, self._lent_blocks(tokens),
                                 self._tenant.get(slot, ""))
                     for slot, tokens in self._retained.items())

    def _lent_blocks(self, tokens: Sequence[int]) -> int:
        """Pool blocks a retained prefix fills: its cells in a unified KV cache; nothing
        when every slot has its own stream."""
        return self.kv.blocks_needed(len(tokens)) if self.unified else 0

    # -- what a slot holds -------------------------------------------------------------

    def kind(self, slot: int) -> SlotKind:
        """Whether ``slot`` is free, retained, running or held (``ValueError`` outside
        ``0 .. n_slots - 1``)."""
        self._check_slot(slot)
        busy = self._busy.get(slot)
        if busy is not None:
            return busy[0]
        return "retained" if slot in self._retained else "free"

    def entry(self, slot: int) -> SlotEntry:
        """What ``slot`` holds."""
        kind = self.kind(slot)
        if kind in ("running", "held"):
            return SlotEntry(kind, request_id=self._busy[slot][1])
        if kind == "retained":
            return SlotEntry(kind, tokens=self._retained[slot],
                             tenant=self._tenant.get(slot, ""))
        return SlotEntry(kind)

    def layout(self) -> tuple[SlotEntry, ...]:
        """Every slot's entry, slot 0 first."""
        return tuple(self.entry(slot) for slot in range(self.n_slots))

    def running_slots(self) -> list[int]:
        return [slot for slot, (kind, _) in self._busy.items() if kind == "running"]

    # -- applying decisions ------------------------------------------------------------

    def apply(self, admission: Admission) -> SlotOps:
        """Take an admission's slots and reserve its KV: ``evict``'s retained slots become
        free, then each of its slots leaves the free or retained ones (``slot`` runs its
        first sequence, ``fork_slots`` are held). A plan made against this table's view
        always applies; a stale one raises ``RuntimeError`` with nothing changed."""
        taken = set(admission.slots)
        for slot in admission.evict:
            if slot not in self._retained or slot in taken:
                raise RuntimeError(f"stale plan: it evicts slot {slot}, which is not retained")
        for slot in admission.slots:
            if slot not in self._free and slot not in self._retained:
                raise RuntimeError(f"stale plan: it admits request {admission.request_id} "
                                   f"into slot {slot}, which is {self.kind(slot)}")
        reserve_admission(self.kv, admission)  # a stale plan raises here, nothing reserved
        for slot in admission.evict:
            self._forget(slot)
            self._free.add(slot)
        clear = list(admission.evict)
        for slot in admission.slots:
            if slot in self._retained:
                self._forget(slot)
            else:
                self._free.remove(slot)
            if not (admission.in_place and slot == admission.slot):
                clear.append(slot)
        self._busy[admission.slot] = ("running", admission.request_id)
        for slot in admission.fork_slots:
            self._busy[slot] = ("held", admission.request_id)
        return SlotOps(tuple(clear), admission.prefix)

    def fork(self, slot: int) -> None:
        """A held slot now runs its choice (the prompt's KV was copied into it)."""
        kind, request_id = self._busy.get(slot, ("free", -1))
        if kind != "held":
            raise ValueError(f"slot {slot} is not held for a choice")
        self._busy[slot] = ("running", request_id)

    def retire(self, slot: int, prefix: Sequence[int] | None = None, *, n_fed: int = 0,
               tenant: str = "") -> tuple[int, ...]:
        """A running or held slot's sequence ends: its KV blocks go back to the allocator.
        With ``prefix`` (the tokens of a sequence that completed after feeding ``n_fed``)
        and ``retains(config, n_fed)``, the slot keeps them as the most recently used
        retained prefix of ``tenant``; else it becomes free. Returns the slots whose KV
        must be cleared, in order: the slot itself when it is not retained, and the least
        recently used retained slots dropped past ``max_retained_slots``."""
        if self._busy.pop(slot, None) is None:
            raise ValueError(f"slot {slot} runs no sequence")
        self.kv.free(slot)
        if prefix is not None and retains(self.config, n_fed):
            return self._keep(slot, prefix, tenant)
        self._free.add(slot)
        return (slot,)

    def adopt(self, slot: int, tokens: Sequence[int], tenant: str) -> tuple[int, ...]:
        """The KV of the free ``slot`` now holds ``tokens`` (a restored sequence): keep it
        as the most recently used retained prefix of ``tenant`` (``ValueError`` if the slot
        is not free). Returns the retained slots dropped, to clear."""
        if self.kind(slot) != "free":
            raise ValueError(f"slot {slot} is not free")
        self._free.remove(slot)
        return self._keep(slot, tokens, tenant)

    def forget(self, slot: int) -> Sequence[int] | None:
        """Drop a retained slot's prefix (the slot becomes free; the caller clears its KV):
        the tokens it held, or None when it retained nothing."""
        if self.kind(slot) != "retained":
            return None
        tokens = self._retained[slot]
        self._forget(slot)
        self._free.add(slot)
        return tokens

    def _keep(self, slot: int, tokens: Sequence[int], tenant: str) -> tuple[int, ...]:
        self._tenant[slot] = tenant
        dropped = retain_prefix(self.config, self._retained, slot, tokens)
        for oldest in dropped:
            self._tenant.pop(oldest, None)
            self._free.add(oldest)
        return tuple(dropped)

    def _forget(self, slot: int) -> None:
        del self._retained[slot]
        self._tenant.pop(slot, None)

    # -- layout ------------------------------------------------------------------------

    def moves(self, max_moves: int) -> list[SlotMove]:
        """The moves that bring the running sequences towards the lowest slots
        (``compaction_moves``); none with a unified KV cache, which has no streams to
        span, or with nothing running."""
        running = self.running_slots()
        if self.unified or not running:
            return []
        return compaction_moves(running, self._retained.keys(), self._free, max_moves)

    def move(self, src: int, dst: int) -> None:
        """``src``'s KV was copied to the free ``dst``: what ``src`` held (a running
        sequence with its KV blocks, or a retained prefix at its place in the least
        recently used order) is now ``dst``'s, and ``src`` is free (its KV to clear)."""
        if self.kind(dst) != "free":
            raise ValueError(f"slot {dst} is not free")
        kind = self.kind(src)
        if kind == "running":
            self.kv.rename(src, dst)
            self._busy[dst] = self._busy.pop(src)
        elif kind == "retained":
            self._retained = {dst if s == src else s: t for s, t in self._retained.items()}
            self._tenant[dst] = self._tenant.pop(src, "")
        else:
            raise ValueError(f"slot {src} is {kind}: only running and retained slots move")
        self._free.remove(dst)
        self._free.add(src)

    # -- checks ------------------------------------------------------------------------

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.n_slots:
            raise ValueError(f"slot {slot} is outside 0..{self.n_slots - 1}")

    def check_integrity(self) -> None:
        """Raise ``RuntimeError`` if an invariant (module docstring) does not hold."""
        self.kv.check_integrity()
        groups = (self._free, set(self._retained), set(self._busy))
        every = [slot for group in groups for slot in group]
        if sorted(every) != list(range(self.n_slots)):
            raise RuntimeError(f"slots are not each exactly one of free, retained, running "
                               f"or held: {sorted(every)}")
        if set(self.kv.sequences()) != set(self._busy):
            raise RuntimeError(f"KV blocks are owned by slots {sorted(self.kv.sequences())}, "
                               f"running or held are {sorted(self._busy)}")
        cap = self.config.max_retained_slots
        if cap is not None and len(self._retained) > cap:
            raise RuntimeError(f"{len(self._retained)} slots retained, past {cap}")
        if set(self._tenant) - set(self._retained):
            raise RuntimeError("a tenant is recorded for a slot that retains nothing")


def reserve_admission(kv: KVBlockAllocator, admission: Admission) -> tuple[int, ...]:
    """Reserve an admission's KV blocks in each of its slots; returns ``slot``'s block
    table. A plan made against ``kv.snapshot()`` always fits; a refusal means the plan is
    stale (``RuntimeError``, with nothing reserved)."""
    tables: list[tuple[int, ...]] = []
    for slot in admission.slots:
        table = kv.allocate(slot, admission.reserve_tokens)
        if table is None:
            for done in admission.slots[: len(tables)]:
                kv.free(done)
            need = kv.snapshot().blocks_needed(admission.reserve_tokens) * len(admission.slots)
            raise RuntimeError(
                f"stale plan: it admits request {admission.request_id} into slots "
                f"{admission.slots} with {admission.reserve_tokens} tokens each ({need} "
                f"blocks), but only {kv.free_blocks} blocks are free"
            )
        tables.append(table)
    return tables[0]
