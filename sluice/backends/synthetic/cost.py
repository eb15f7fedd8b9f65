"""What a synthetic call costs and whether it fails: service times and injected faults
read from a spec's options, and the hash every synthetic output is a pure function of."""

from __future__ import annotations

import hashlib
import threading
import time

from sluice.backends.base import BackendError, ModelSpec


def digest(*parts: object) -> bytes:
    """SHA-256 of the parts' ``str`` forms joined by a unit separator: the same parts give
    the same bytes in every process."""
    return hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()


class CostModel:
    """Reads the cost and fault options of a spec, and counts calls for fault injection."""

    def __init__(self, spec: ModelSpec) -> None:
        opts = spec.options
        self.scale = float(opts.get("speed_scale", 1.0))
        self.fail_on_calls = frozenset(int(n) for n in opts.get("fail_on_calls", ()))
        self._calls = 0
        self._lock = threading.Lock()

    def option_s(self, spec: ModelSpec, key: str, default: float) -> float:
        return float(spec.options.get(key, default)) * self.scale

    def next_call(self, what: str) -> None:
        """Count one call; raise if it is one of the injected failures."""
        with self._lock:
            self._calls += 1
            n = self._calls
        if n in self.fail_on_calls:
            raise BackendError(f"injected fault in {what} call {n}")


def sleep(seconds: float) -> None:
    """Spend a call's service time (nothing for zero or less)."""
    if seconds > 0:
        time.sleep(seconds)
