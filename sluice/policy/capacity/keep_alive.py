"""How long an idle model stays loaded: Ollama's ``keep_alive`` and pinning.

A model's keep-alive is set by its configuration and, per request, by the request's own
``keep_alive`` (Ollama's field): the latest request's value holds until the next one, and a
request that brings none restores the configured value. An operator's pin (``pinned`` in the
config) is never overridden by a request.

Forms accepted (Ollama's): a number of seconds (``300``, ``0``), a duration string
(``"5m"``, ``"1h30m"``, ``"10s"``, ``"250ms"``), a negative number or duration (``-1``,
``"-1m"``): keep it loaded and never evict it (pinned). ``0`` unloads the model once its last
request ends.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")


@dataclass(frozen=True, slots=True)
class KeepAlive:
    """What happens to a model once it is idle (no request running, queued or waiting).

    Invariants: ``idle_s`` is ``None`` or a finite number >= 0; a pinned model has
    ``idle_s is None``.
    """

    idle_s: float | None = None
    """Seconds idle before it is unloaded; ``None``: it stays until evicted to make room."""
    pinned: bool = False
    """Never unloaded by time nor evicted for another model."""

    def __post_init__(self) -> None:
        if self.idle_s is not None and not (math.isfinite(self.idle_s) and self.idle_s >= 0):
            raise ValueError(f"keep_alive idle_s must be a finite number >= 0, got {self.idle_s}")
        if self.pinned and self.idle_s is not None:
            raise ValueError("a pinned keep_alive has no idle_s")

    def describe(self) -> str:
        """``pinned``, ``until evicted`` or the idle time in seconds (``300s``)."""
        if self.pinned:
            return "pinned"
        if self.idle_s is None:
            return "until evicted"
        return f"{self.idle_s:g}s"


STAY = KeepAlive()
"""No idle unload: the model stays until eviction makes room for another."""
PINNED = KeepAlive(pinned=True)


def configured_keep_alive(idle_s: float | None, pinned: bool) -> KeepAlive:
    """A model's keep-alive from its configuration's two fields."""
    return PINNED if pinned else KeepAlive(idle_s=idle_s)


def parse_keep_alive(value: float | int | str) -> KeepAlive:
    """A ``KeepAlive`` from Ollama's forms (see the module docstring); ``ValueError`` naming
    the value otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"keep_alive must be a number of seconds or a duration, got {value!r}")
    seconds = float(value) if isinstance(value, int | float) else _parse_duration(value.strip())
    if not math.isfinite(seconds):
        raise ValueError(f"keep_alive must be finite, got {value!r}")
    if seconds < 0:
        return PINNED
    return KeepAlive(idle_s=seconds)


def _parse_duration(text: str) -> float:
    sign = -1.0 if text.startswith("-") else 1.0
    body = text[1:] if sign < 0 else text
    try:
        return sign * float(body)  # a bare number in a string: seconds ("300", "-1")
    except ValueError:
        pass
    parts = _PART.findall(body)
    if not body or "".join(n + u for n, u in parts) != body:
        raise ValueError(f"keep_alive {text!r} is not a duration such as 300, '5m', '1h', "
                         f"'30s' or -1 (pinned)")
    return sign * sum(float(n) * _UNIT_S[u] for n, u in parts)


def effective_keep_alive(configured: KeepAlive, requested: KeepAlive | None) -> KeepAlive:
    """What a request leaves its model with: a configured pin always; else the request's
    value, or the configured one when the request brings none."""
    if configured.pinned or requested is None:
        return configured
    return requested


def expires_at_s(keep_alive: KeepAlive, last_used_s: float, in_use: int) -> float | None:
    """When an idle model is due to unload: ``last_used_s + idle_s``; ``None`` while in use,
    pinned or kept until evicted."""
    if in_use > 0 or keep_alive.idle_s is None:
        return None
    return last_used_s + keep_alive.idle_s
