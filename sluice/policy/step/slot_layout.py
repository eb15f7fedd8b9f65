"""Where sequences sit among the slots: keep the running ones on the lowest slots.

With one KV stream per slot (llama.cpp's split KV cache), a decode step attends over every
stream from the batch's lowest slot to its highest, the idle ones between included
(masked): 12 sequences spread up to slot 31 decode 2.8x slower than the same 12 on slots
0-11 (measured on the packaged Gemma 3 270M). Slots go out lowest first, but holes open as sequences
end: a running sequence above a finished one, or a retained prefix (an ended sequence's
KV kept as a donor) below running ones. Moving a sequence's KV to another stream costs a
copy of that stream (about 3 ms on the packaged model's 1024-cell streams, paid in the
next decode), far less than a step over a wider span.

``compaction_moves`` decides the moves: while a free or retained slot lies below the
highest running sequence, the highest running sequence moves into the lowest such slot;
a retained prefix in the way first moves up to the highest free slot above every running
sequence (so later admissions, which take the lowest free slot, land below it); with no
free slot up there it stays, and the hole with it.

Pure: slots in, actions out; the engine applies them in order.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

MAX_SLOT_MOVES_PER_STEP = 2
"""KV stream copies an engine makes before a step to keep its running sequences on the
lowest slots: about 3 ms each on the packaged model."""


@dataclass(frozen=True, slots=True)
class SlotMove:
    """Move the KV (and the sequence or retained prefix) in ``src`` to the empty ``dst``."""

    src: int
    dst: int


def compaction_moves(running: Collection[int], retained: Collection[int],
                     free: Collection[int], max_moves: int) -> list[SlotMove]:
    """Moves, in order, that bring the running sequences towards the lowest slots, at most
    ``max_moves``. Slots in none of the three collections (held for a request's later
    choices) stay put and are never filled. A retained prefix below the highest running
    sequence is moved up out of the way when a free slot above every running one exists
    (and the budget has room for both moves), else left where it is (a prefix worth
    keeping is never dropped for layout; the slot is handed out when no free one is left).

    Invariants of the result, applied in order: a move's ``src`` holds a running sequence
    or a retained prefix and its ``dst`` is free at that point; the highest running slot
    never rises; a retained prefix moves only to a slot above every running one."""
    run, ret, empty = set(running), set(retained), set(free)
    moves: list[SlotMove] = []
    while run and len(moves) < max_moves:
        top = max(run)
        above = [s for s in empty if s > top]
        room_above = bool(above) and len(moves) + 2 <= max_moves
        hole = min((s for s in empty | ret if s < top and (s in empty or room_above)),
                   default=None)
        if hole is None:
            break
        if hole in ret:
            up = max(above)
            moves.append(SlotMove(hole, up))
            ret.discard(hole)
            ret.add(up)
            empty.discard(up)
            empty.add(hole)
        moves.append(SlotMove(top, hole))
        empty.discard(hole)
        empty.add(top)
        run.discard(top)
        run.add(hole)
    return moves
