"""Incremental detokenization with stop strings.

Bytes from tokens are decoded as UTF-8 incrementally (a multi-byte character split over
tokens is held until complete). Text that might be the start of a stop string is held
back, so a client never sees part of a stop string.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class TextStream:
    """Accumulates generated text; ``push`` returns the newly safe-to-show text."""

    def __init__(self, stop: Sequence[str] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = tuple(s for s in stop if s)
        self._text = ""
        self._shown = 0
        self.stopped = False
        self.matched: str | None = None
        """The stop string that ended the text, once ``stopped``."""

    @property
    def text(self) -> str:
        """All text shown or still to show (stop string excluded once stopped)."""
        return self._text

    def push(self, piece: bytes) -> str:
        """Add a token's bytes; return the text that became safe to show."""
        if self.stopped:
            return ""
        self._text += self._decoder.decode(piece)
        cut = self._find_stop()
        if cut is not None:
            self.matched = next(s for s in self._stop if self._text.startswith(s, cut))
            self._text = self._text[:cut]
            self.stopped = True
            return self._take(len(self._text))
        return self._take(len(self._text) - self._held_back())

    def flush(self) -> str:
        """At the end of generation: everything not yet shown."""
        if not self.stopped:
            self._text += self._decoder.decode(b"", final=True)
        return self._take(len(self._text))

    def _take(self, upto: int) -> str:
        upto = max(upto, self._shown)
        out = self._text[self._shown : upto]
        self._shown = upto
        return out

    def _find_stop(self) -> int | None:
        if not self._stop:
            return None
        longest = max(map(len, self._stop))
        start = max(0, self._shown - longest)
        hits = [i for s in self._stop if (i := self._text.find(s, start)) >= 0]
        return min(hits) if hits else None

    def _held_back(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of a stop."""
        best = 0
        for s in self._stop:
            for n in range(min(len(s) - 1, len(self._text)), best, -1):
                if self._text.endswith(s[:n]):
                    best = n
                    break
        return best
