"""KV-cache block allocator for continuous batching.

A sequence reserves blocks for its whole budget (prompt + max new tokens) when it is admitted
and gives them all back the moment it retires. Check, then act: ``never_fits`` (refuse),
``can_allocate`` (admit now or wait), ``allocate``, ``free``. A planner checks against a
``KVSnapshot`` (plain numbers) and the engine or simulator then allocates what it planned.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KVSnapshot:
    """The allocator's capacity as numbers, for planning without touching the allocator.

    A planner checks admissions against a snapshot and takes each admission's blocks off
    its local copy (``after_reserving``), so several admissions in one plan never count
    the same free block twice. The allocator answers its own checks through a snapshot,
    so the arithmetic lives here once.
    """

    total_blocks: int
    free_blocks: int
    block_size_tokens: int
    max_seq_tokens: int
    """Most tokens one sequence may reserve."""

    def blocks_needed(self, n_tokens: int) -> int:
        """Blocks that hold ``n_tokens`` tokens (ceil division)."""
        if n_tokens < 0:
            raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
        return -(-n_tokens // self.block_size_tokens)

    def never_fits(self, n_tokens: int) -> bool:
        """Whether ``n_tokens`` can never be held: over ``max_seq_tokens`` or all blocks."""
        return n_tokens > self.max_seq_tokens or self.blocks_needed(n_tokens) > self.total_blocks

    def can_allocate(self, n_tokens: int) -> bool:
        """Whether ``n_tokens`` could be reserved now."""
        return not self.never_fits(n_tokens) and self.blocks_needed(n_tokens) <= self.free_blocks

    def after_reserving(self, n_tokens: int) -> KVSnapshot:
        """The capacity left once ``n_tokens`` are reserved; ``ValueError`` if they do not
        fit (check ``can_allocate`` first)."""
        if not self.can_allocate(n_tokens):
            raise ValueError(f"{n_tokens} tokens do not fit in {self.free_blocks} free blocks")
        return KVSnapshot(
            self.total_blocks, self.free_blocks - self.blocks_needed(n_tokens),
            self.block_size_tokens, self.max_seq_tokens,
        )


class KVBlockAllocator:
    """Fixed-size blocks of ``block_size_tokens``; a free list; per-sequence block tables.

    Invariants: every block is either free or owned by exactly one sequence;
    ``free_blocks + used_blocks == total_blocks``; a sequence holds exactly
    ``blocks_needed(n_tokens)`` blocks for the tokens it reserved, and never more than
    ``max_seq_tokens`` tokens. Freed blocks are reused first (LIFO), fresh ones in id order.
    """

    def __init__(self, total_blocks: int, block_size_tokens: int, max_seq_tokens: int) -> None:
        for field, value in (
            ("total_blocks", total_blocks),
            ("block_size_tokens", block_size_tokens),
            ("max_seq_tokens", max_seq_tokens),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{field} must be an int >= 1, got {value!r}")
        self.total_blocks = total_blocks
        self.block_size_tokens = block_size_tokens
        self.max_seq_tokens = max_seq_tokens
        self._free: list[int] = list(range(total_blocks - 1, -1, -1))
        """A stack: ``pop()`` gives the lowest fresh block id first."""
        self._tables: dict[int, tuple[int, ...]] = {}
        self._tokens: dict[int, int] = {}

    @classmethod
    def for_context(
        cls, n_ctx_tokens: int, n_seq_max: int, block_size_tokens: int, unified: bool
    ) -> KVBlockAllocator:
        """An allocator sized from a llama.cpp context: ``n_ctx_tokens // block_size_tokens``
        blocks; one sequence may use the whole context if the KV cache is ``unified``, else
        its ``n_ctx_tokens // n_seq_max`` slice."""
        if n_seq_max < 1:
            raise ValueError(f"n_seq_max must be >= 1, got {n_seq_max}")
        if block_size_tokens < 1:
            raise ValueError(f"block_size_tokens must be >= 1, got {block_size_tokens}")
        if n_ctx_tokens < block_size_tokens:
            raise ValueError(
                f"n_ctx_tokens must be >= block_size_tokens ({block_size_tokens}), "
                f"got {n_ctx_tokens}"
            )
        max_seq_tokens = n_ctx_tokens if unified else n_ctx_tokens // n_seq_max
        if max_seq_tokens < 1:
            raise ValueError(
                f"n_ctx_tokens {n_ctx_tokens} split over n_seq_max {n_seq_max} leaves no tokens"
            )
        return cls(n_ctx_tokens // block_size_tokens, block_size_tokens, max_seq_tokens)

    @property
    def free_blocks(self) -> int:
        """Blocks not owned by any sequence."""
        return len(self._free)

    @property
    def used_blocks(self) -> int:
        """Blocks owned by sequences."""
        return self.total_blocks - len(self._free)

    def snapshot(self) -> KVSnapshot:
        """The capacity now, as plain numbers (what a step planner plans against)."""
        return KVSnapshot(
            self.total_blocks, len(self._free), self.block_size_tokens, self.max_seq_tokens
        )

    def blocks_needed(self, n_tokens: int) -> int:
        """Blocks that hold ``n_tokens`` tokens (ceil division)."""
        return self.snapshot().blocks_needed(n_tokens)

    def never_fits(self, n_tokens: int) -> bool:
        """Whether ``n_tokens`` can never be held: over ``max_seq_tokens`` or all blocks."""
        return self.snapshot().never_fits(n_tokens)

    def can_allocate(self, n_tokens: int) -> bool:
        """Whether ``n_tokens`` could be reserved now."""
        return self.snapshot().can_allocate(n_tokens)

    def allocate(self, seq_id: int, n_tokens: int) -> tuple[int, ...] | None:
        """Reserve blocks for ``n_tokens`` of sequence ``seq_id`` and return its block table;
        ``None`` if they cannot be reserved now (see ``never_fits`` for never); ``ValueError``
        if ``seq_id`` already holds blocks."""
        if seq_id in self._tables:
            raise ValueError(f"seq_id {seq_id} already holds blocks")
        if not self.can_allocate(n_tokens):
            return None
        n_blocks = self.blocks_needed(n_tokens)
        table = tuple(self._free.pop() for _ in range(n_blocks))
        self._tables[seq_id] = table
        self._tokens[seq_id] = n_tokens
        return table

    def free(self, seq_id: int) -> int:
        """Return ``seq_id``'s blocks to the free list; the number freed (0 if it held none)."""
        table = self._tables.pop(seq_id, None)
        if table is None:
            return 0
        del self._tokens[seq_id]
        self._free.extend(reversed(table))
        return len(table)

    def rename(self, seq_id: int, new_seq_id: int) -> None:
        """Hand ``seq_id``'s reservation (if any) to ``new_seq_id``, which must hold none
        (``ValueError``): a sequence moved to another slot keeps its blocks."""
        if new_seq_id in self._tables:
            raise ValueError(f"seq_id {new_seq_id} already holds blocks")
        if seq_id in self._tables:
            self._tables[new_seq_id] = self._tables.pop(seq_id)
            self._tokens[new_seq_id] = self._tokens.pop(seq_id)

    def block_table(self, seq_id: int) -> tuple[int, ...]:
        """The blocks ``seq_id`` owns, in order (empty if none)."""
        return self._tables.get(seq_id, ())

    def sequences(self) -> list[int]:
        """Sequence ids that hold a reservation, in allocation order."""
        return list(self._tables)

    def check_integrity(self) -> None:
        """Raise ``RuntimeError`` if an invariant does not hold."""
        seen: set[int] = set()
        for block in self._free:
            if block in seen or not 0 <= block < self.total_blocks:
                raise RuntimeError(f"free list holds block {block} twice or out of range")
            seen.add(block)
        for seq_id, table in self._tables.items():
            if len(table) != self.blocks_needed(self._tokens[seq_id]):
                raise RuntimeError(
                    f"seq {seq_id} holds {len(table)} blocks for {self._tokens[seq_id]} tokens"
                )
            if self._tokens[seq_id] > self.max_seq_tokens:
                raise RuntimeError(f"seq {seq_id} holds more than max_seq_tokens")
            for block in table:
                if block in seen or not 0 <= block < self.total_blocks:
                    raise RuntimeError(f"block {block} of seq {seq_id} is owned twice or free")
                seen.add(block)
        if len(seen) != self.total_blocks:
            raise RuntimeError(f"{self.total_blocks - len(seen)} blocks are neither free nor owned")
        if set(self._tables) != set(self._tokens):
            raise RuntimeError("block tables and token counts name different sequences")
