"""A slot's KV to and from a file (llama-server's ``POST /slots/{id}?action=save|restore``),
so that a long shared prefix (a system prompt) survives a restart or moves to another slot
without being computed again. (``erase`` is ``ContinuousEngine.erase_slot``.)

Each operation runs on the worker thread that owns the engine, between two steps (it is sent
as a message: ``Runtime.on_engine``), so the KV it reads or writes is exactly the tokens the
engine's bookkeeping says the slot holds:

- ``save``: a retained prefix, or a running sequence's fed tokens, with its KV, to the file
  (a free slot saves an empty sequence).
- ``restore``: the file's tokens and KV into an idle slot (free or retained; a retained
  prefix there is dropped first), which then holds them as a retained prefix of the
  requesting tenant: the next request whose prompt starts with them reuses them, as it would
  a prefix the engine kept itself.

A slot that a request is using (running, or held for one of its choices) is not restored
into (``SlotError`` ``slot_busy``); a slot holding another tenant's prompt is not saved
unless prefixes are shared across tenants (``engine.share_prefix_across_tenants``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from sluice.backends.base import BackendError
from sluice.engine.continuous import ContinuousEngine


class SlotError(Exception):
    """A slot operation refused or failed; ``code`` says which, for the client."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class SlotResult:
    """What an operation did: the tokens saved or restored, the file's bytes written or
    read, and how long it took."""

    n_tokens: int
    n_bytes: int
    seconds: float


def save_slot(engine: ContinuousEngine, slot: int, path: Path, tenant: str) -> SlotResult:
    """Write ``slot``'s tokens and KV to ``path``."""
    t0 = time.perf_counter()
    holding = engine.slot_holding(slot)
    if holding.state == "held":
        raise SlotError("slot_busy", f"slot {slot} is held for a request that is starting")
    if (holding.tokens and holding.tenant != tenant
            and not engine.config.share_prefix_across_tenants):
        raise SlotError("slot_of_another_tenant",
                        f"slot {slot} holds another tenant's prompt")
    try:
        written = engine.model.save_sequence(slot, path, list(holding.tokens))
    except BackendError as exc:
        raise SlotError("slot_save_failed", str(exc)) from None
    return SlotResult(len(holding.tokens), written, time.perf_counter() - t0)


def restore_slot(engine: ContinuousEngine, slot: int, path: Path, tenant: str) -> SlotResult:
    """Load ``path`` into the idle ``slot`` as a retained prefix of ``tenant``."""
    t0 = time.perf_counter()
    config = engine.config
    if not (config.retain_prefixes and config.prefix_reuse) or config.max_retained_slots == 0:
        raise SlotError("prefix_reuse_off", "this engine keeps no prefixes in idle slots "
                                            "(engine.retain_prefixes, prefix_reuse, "
                                            "max_retained_slots), so a restored slot would "
                                            "never be reused")
    if engine.erase_slot(slot) is None:
        raise SlotError("slot_busy", f"slot {slot} is serving a request; retry when it ends")
    try:
        tokens, read = engine.model.load_sequence(slot, path)
    except BackendError as exc:
        raise SlotError("invalid_slot_file", str(exc)) from None
    engine.adopt_slot(slot, tokens, tenant)
    return SlotResult(len(tokens), read, time.perf_counter() - t0)
