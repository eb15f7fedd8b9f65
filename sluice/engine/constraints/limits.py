"""What a client's decoding constraint may cost, checked before it is compiled, and the cache
of compiled grammars bounded by the size of what it holds.

A compiled grammar's memory and its compile time grow with its schema: measured on Gemma 3's
vocabulary, a 97 KB schema of 800 ``anyOf`` branches compiles in 0.1 s of CPU and holds
about 10 MB, a 600 KB one of 5,000 branches 0.7 s and 80 MB (100-130 bytes of memory per
schema byte). So
the limits below are checked on the schema's text and its parsed JSON (linear, a few ms at
the limits) before llguidance sees it, and the cache is bounded by the schema bytes it
holds, not by a count of grammars.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sluice.engine.request import Constraint

CACHE_SCHEMA_BYTES = 500_000
"""Schema (or grammar) text the compiled-grammar cache holds at most, summed over its
entries: about 50-65 MB of compiled grammars at the ratios measured, five schemas at
``max_schema_bytes``, hundreds of the usual few-KB ones."""
CACHE_ENTRY_OVERHEAD_BYTES = 1_024
"""Counted for each cached grammar beside its text (a compiled grammar's fixed part)."""


class ConstraintError(ValueError):
    """The constraint cannot be compiled; the message is fit for the client."""


class ConstraintLimitError(ConstraintError):
    """The constraint breaks one of the server's limits (``limit``: the setting's name)."""

    def __init__(self, message: str, limit: str) -> None:
        super().__init__(message)
        self.limit = limit


@dataclass(frozen=True, slots=True)
class ConstraintLimits:
    """The most a client's constraint may ask for (``[constraints]`` in the config)."""

    max_schema_bytes: int = 100_000
    """The schema's (or regex's, or grammar's) text, in UTF-8 bytes."""
    max_schema_depth: int = 64
    """Nesting of the JSON schema's objects and arrays (``properties`` inside an object's
    schema is two levels)."""
    max_schema_alternatives: int = 1_000
    """Branches of every ``anyOf``, ``oneOf`` and ``allOf`` plus the values of every
    ``enum``, summed over the schema."""
    max_compile_ms: float = 2_000.0
    """Compiling one grammar for the model's vocabulary (the vocabulary itself, built once
    per model, is not counted); a grammar that took longer is refused and not kept."""

    def __post_init__(self) -> None:
        for name in ("max_schema_bytes", "max_schema_depth", "max_schema_alternatives",
                     "max_compile_ms"):
            if getattr(self, name) <= 0:
                raise ValueError(f"constraints.{name} must be > 0, got {getattr(self, name)}")


_BRANCHES = ("anyOf", "oneOf", "allOf")


def check_limits(constraint: Constraint, limits: ConstraintLimits) -> None:
    """``ConstraintLimitError`` naming the limit ``constraint`` breaks, if any; a schema that
    is not JSON is left to the compiler's own message."""
    size = len(constraint.spec.encode("utf-8"))
    if size > limits.max_schema_bytes:
        what = "JSON schema" if constraint.kind == "json_schema" else constraint.kind
        raise ConstraintLimitError(
            f"the {what} is {size} bytes; this server takes at most {limits.max_schema_bytes} "
            f"(constraints.max_schema_bytes)", "max_schema_bytes")
    if constraint.kind != "json_schema":
        return
    try:
        schema = json.loads(constraint.spec)
    except RecursionError:
        raise _too_deep(limits) from None
    except ValueError:
        return
    depth, alternatives = _shape(schema, limits)
    if depth > limits.max_schema_depth:
        raise _too_deep(limits)
    if alternatives > limits.max_schema_alternatives:
        raise ConstraintLimitError(
            f"the JSON schema has {alternatives} alternatives (anyOf/oneOf/allOf branches and "
            f"enum values); this server takes at most {limits.max_schema_alternatives} "
            f"(constraints.max_schema_alternatives)", "max_schema_alternatives")


def _too_deep(limits: ConstraintLimits) -> ConstraintLimitError:
    return ConstraintLimitError(
        f"the JSON schema is nested more than {limits.max_schema_depth} levels deep "
        f"(constraints.max_schema_depth)", "max_schema_depth")


def _shape(schema: Any, limits: ConstraintLimits) -> tuple[int, int]:
    """The deepest nesting of objects and arrays in ``schema`` and its count of
    alternatives; iterative (no recursion limit), and it stops once past the depth limit."""
    deepest, alternatives = 0, 0
    stack: list[tuple[Any, int]] = [(schema, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
            for key in _BRANCHES:
                if isinstance(node.get(key), list):
                    alternatives += len(node[key])
            if isinstance(node.get("enum"), list):
                alternatives += len(node["enum"])
        elif isinstance(node, list):
            children = node
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > limits.max_schema_depth:
            return deepest, alternatives
        stack.extend((child, depth + 1) for child in children)
    return deepest, alternatives


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class SizedCache(Generic[K, V]):
    """A least-recently-used cache bounded by the summed ``weight`` of its entries (an entry
    heavier than the whole budget is never kept). Thread-safe; a value is built outside
    the lock, so two threads may both build one key (the second result is dropped)."""

    def __init__(self, budget: int, weight: Callable[[K], int]) -> None:
        self.budget = budget
        self._weight = weight
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()

    @property
    def held(self) -> int:
        """The summed weight of what is cached (at most ``budget``)."""
        return self._held

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> V | None:
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                return None
            self._entries.move_to_end(key)
            return found[0]

    def put(self, key: K, value: V) -> None:
        weight = self._weight(key)
        if weight > self.budget:
            return
        with self._lock:
            if key in self._entries:
                return
            self._entries[key] = (value, weight)
            self._held += weight
            while self._held > self.budget:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._held -= dropped

    def discard(self, key: K) -> None:
        with self._lock:
            found = self._entries.pop(key, None)
            if found is not None:
                self._held -= found[1]
