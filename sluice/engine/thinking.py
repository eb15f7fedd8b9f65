"""A budget of thinking tokens: a sequence that has thought for ``budget_tokens`` tokens
without closing its thinking is given the end tag's tokens next, so it goes on to the
answer. Pure bookkeeping over the sequence's text; the engine asks for the next forced
token before it takes a sampled one."""

from __future__ import annotations

from sluice.engine.request import ThinkingLimit

TAIL_CHARS = 64
"""More than one token's text: how far back from the end the end tag is looked for."""


class ThinkingBudget:
    """One sequence's thinking so far. Invariants: tokens are counted only inside the
    thinking; once the end tag is in the text (written by the model or forced) nothing more
    is forced; the end tag's tokens are forced at most once."""

    def __init__(self, limit: ThinkingLimit) -> None:
        self.limit = limit
        self.inside = limit.opened
        self.done = False
        self.spent_tokens = 0
        self._forced: list[int] = []
        self._offered = False
        if self.inside and limit.budget_tokens <= 0:
            self._force()

    def _force(self) -> None:
        if not self._offered:
            self._offered = True
            self._forced = list(self.limit.end_tokens)

    def next_forced(self) -> int | None:
        """The token the sequence must take next (None: sample as usual)."""
        return self._forced.pop(0) if self._forced else None

    def observe(self, text: str) -> None:
        """After a token: ``text`` is everything the sequence generated so far."""
        if self.done:
            return
        limit = self.limit
        if not self.inside:
            head = text.lstrip()[: len(limit.start) + 1]
            if head.startswith(limit.start):
                self.inside = True
                if limit.budget_tokens <= 0:
                    self._force()
            elif not limit.start.startswith(head):
                self.done = True  # the output does not think
            return
        # the tag can only have completed within the last token's text: look at the tail
        if limit.end in text[-(len(limit.end) + TAIL_CHARS):]:
            self.done = True
            self._forced = []
            return
        self.spent_tokens += 1
        if self.spent_tokens >= limit.budget_tokens:
            self._force()
